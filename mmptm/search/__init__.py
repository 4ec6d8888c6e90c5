"""Search indexes over collections embedded by a trained dual encoder (``mmptm index``,
``mmptm retrieve``, ``mmptm serve``)."""

import logging

# importing faiss logs (INFO) each CPU build it tries to load: noise under the CLI's logging
logging.getLogger("faiss.loader").setLevel(logging.WARNING)
