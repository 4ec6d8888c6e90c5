"""A study moves a recipe's toyworld paths to its own data, and writes the views it reads."""

from __future__ import annotations

from pathlib import Path

from mmptm.studies.common import recipe_views, relocated


def test_every_toyworld_path_of_a_recipe_moves_with_its_key():
    moved = dict(o.split("=", 1) for o in relocated("video_clip_tiny", Path("/d")))
    assert moved == {
        "data.sources.video.shards": "/d/video/train-*.tar",
        "data.sources.images.shards": "/d/image_text/train-*.tar",
        "data.val": "/d/video/val-*.tar",
        "data.test": "/d/video/test-*.tar",
        "data.tokenizer": "/d/tokenizer.model",  # from the base recipe, _toyworld.yaml
    }
    units = dict(o.split("=", 1) for o in relocated("videobert_tiny", Path("/d")))
    assert units["model.encoders.units.codebook"] == "/d/video_features/codebook.npy"


def test_the_views_a_recipe_reads():
    assert recipe_views("video_clip_tiny") == {"video", "image_text"}  # images as 1-frame clips
    assert recipe_views("videoclip_tiny") == {"video_features"}
    assert recipe_views("clip_tiny") == {"image_text"}
    assert recipe_views("ernie_vl_tiny") == {"knowledge"}
