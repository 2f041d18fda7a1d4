"""prove_patch_tests.py: every patch's tests pass patched and fail below it (`rigstack prove-patch-tests`)."""

from rigstack.commands import entry
from rigstack.commands.prove_patch_tests import app

if __name__ == "__main__":
    entry(app)
