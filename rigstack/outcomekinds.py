"""The words the patch proof, its pytest plugin and the patch headers share (rigstack.patchtests reads what
rigstack.pytest_outcomes writes; rigstack.stack checks a Proof: header against VERDICTS). Apart from the plugin, so
that the proof imports no pytest: the tool's own venv has none."""

PROPERTY = "rigstack_failure"
DESELECTED_OPTION = "--rigstack-deselected"  # a file to write the node ids that -m left out to, as a JSON list
ASSERTION, COULD_NOT_RUN, RAISED = "assertion", "could not run", "raised"
# An environment variable naming a JSON list of package files whose functions a failing test must reach to prove
# behaviour (the files the patches change); the plugin records which it reached.
REACH_ENV = "RIGSTACK_PROOF_REACH"
# A patch's verdicts, strongest first; its Proof: header pins one.
BEHAVIOUR = "proven by behaviour"
WIRING_UNPROVEN = "additive: wiring unproven"
NEW_FILES_ONLY = "additive: new files only"
VERDICTS = (BEHAVIOUR, WIRING_UNPROVEN, NEW_FILES_ONLY)
