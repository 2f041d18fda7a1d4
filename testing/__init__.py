"""Helpers the tests share (pre-commit's `testing/` layout): import them as `testing.X`, never from a test module.

    testing.net        free_port
    testing.patches    PatchMaker: real patches made with real git from a pristine tree
    testing.cli        run_apply (apply.py as a user runs it), one_line_error
    testing.forks      Repo: a small git repository standing in for a user's fork
    testing.server     the pytest plugin with tiny models and real vLLM CPU servers (tests/conftest.py loads it)
    testing.probes     running the probe scripts, small result files, the probe server's flags
    testing.preflight  preflight contexts and status assertions
    testing.worker     a scheduler output for vLLM worker tests
"""
