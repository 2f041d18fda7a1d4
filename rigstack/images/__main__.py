"""`python -m rigstack.images build|verify-image|base`, the names the image commands had before `rigstack image`.

An entry point, so it lives here and not in the library: the library never imports the command layer.
"""

from rigstack.commands import entry
from rigstack.commands.image import module_app

entry(module_app)
