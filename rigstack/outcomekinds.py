"""The words the patch proof and its pytest plugin share (rigstack.patchtests reads what rigstack.pytest_outcomes
writes). Apart from the plugin, so that the proof imports no pytest: the tool's own venv has none."""

PROPERTY = "rigstack_failure"
DESELECTED_OPTION = "--rigstack-deselected"  # a file to write the node ids that -m left out to, as a JSON list
ASSERTION, COULD_NOT_RUN, RAISED = "assertion", "could not run", "raised"
