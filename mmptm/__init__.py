"""mmptm: config-driven pre-training of multimodal and multilingual Transformers.

The public API (:mod:`mmptm.api`): recipes by name (:func:`list_recipes`,
:func:`load_recipe`), fresh models (:func:`create_model`), trained runs with their
transforms (:func:`load`), training (:func:`pretrain`, :func:`finetune`) and the registered
parts (:func:`list_parts`). Importing ``mmptm`` is cheap: the API loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmptm.version import __version__

__all__ = [
    "Run",
    "__version__",
    "add_recipe_dir",
    "create_model",
    "finetune",
    "list_parts",
    "list_recipes",
    "load",
    "load_recipe",
    "pretrain",
    "recipe_path",
]

if TYPE_CHECKING:
    from mmptm.api import (
        Run,
        add_recipe_dir,
        create_model,
        finetune,
        list_parts,
        list_recipes,
        load,
        load_recipe,
        pretrain,
        recipe_path,
    )


def __getattr__(name: str) -> Any:
    # Lazily: every submodule import runs this package's __init__, and the API sits on the
    # top floor (it imports training, search and the models).
    if name in __all__:
        from mmptm import api

        return getattr(api, name)
    raise AttributeError(f"module 'mmptm' has no attribute {name!r}")
