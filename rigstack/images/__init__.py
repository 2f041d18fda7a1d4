"""`python -m rigstack.images build|verify-image|base` (its __main__.py): the image commands under the names they had
before `rigstack image`. Only the entry point lives here; the rig images themselves are rigstack.rigimages."""
