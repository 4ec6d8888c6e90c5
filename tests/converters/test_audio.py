"""Audio converters: Clotho, AudioCaps, ESC-50 and LibriSpeech layouts in tiny fake copies."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from mmptm.cli import main as cli_main
from mmptm.converters import audio as ca
from mmptm.data.shards import SkipCounter, tar_samples
from mmptm.modalities.audio_io import encode_audio, read_audio

RATE = 16000
Q = 1 / 32767  # one step of 16-bit PCM


def _wave(seed: int, seconds: float = 0.25, rate: int = RATE) -> np.ndarray:
    """Noise plus a tone, on the 16-bit grid so that 16-bit files hold it exactly."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * rng.standard_normal(len(t))
    return (np.round(x * 32767) / 32767).astype(np.float32)


def _m4a(wave: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="ipod") as container:
        stream = container.add_stream("aac", rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(wave[None], format="fltp", layout="mono")
        frame.rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


CORRUPT = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00garbage" * 20


def _write_audio(path: Path, seed: int, rate: int = RATE, pcm24: bool = False) -> np.ndarray:
    """A clip as path's format; returns what read_audio gives back for the file. ``pcm24``:
    a 24-bit flac, which re-encoding (16-bit) would change."""
    wave = _wave(seed, rate=rate)
    fmt = path.suffix.lstrip(".")
    if pcm24:
        buf = io.BytesIO()
        sf.write(buf, wave, rate, format="FLAC", subtype="PCM_24")
        data = buf.getvalue()
    else:
        data = _m4a(wave, rate) if fmt == "m4a" else encode_audio(wave, rate, fmt)
    path.write_bytes(data)
    return read_audio(data, fmt, str(path))[0]


def _samples(shards: list[str]) -> dict[str, dict]:
    """key -> sample with ``json`` parsed and ``flac`` decoded as ``wave``, ``rate``."""
    handler = SkipCounter()
    out = {}
    for s in tar_samples(shards, handler):
        s["meta"] = json.loads(s["json"])
        s["wave"], s["rate"] = read_audio(s["flac"], "flac", s["__key__"])
        out[s["__key__"]] = s
    assert handler.count == 0
    return out


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=Q)


# ---------------------------------------------------------------------------------------------
# Clotho


@pytest.fixture
def clotho(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    audio = tmp_path / "development"
    audio.mkdir()
    waves = {
        "a dog, barking.wav": _write_audio(audio / "a dog, barking.wav", 1),
        "rain.wav": _write_audio(audio / "rain.wav", 2),
        "street.flac": _write_audio(audio / "street.flac", 3, pcm24=True),
        "rain.m4a": _write_audio(audio / "rain.m4a", 4),  # key "rain" is taken: "rain_2"
    }
    (audio / "broken.wav").write_bytes(CORRUPT)
    caps = [f'"caption {i}, with a comma"' for i in range(1, 6)]
    csv = tmp_path / "clotho_captions_development.csv"
    csv.write_text(
        "file_name,caption_1,caption_2,caption_3,caption_4,caption_5\n"
        f'"a dog, barking.wav",{",".join(caps)}\n'
        'rain.wav,"rain ""falls"" on a roof",b,c,d,e\n'
        "street.flac,cars pass,,,,\n"
        "gone.wav,x,x,x,x,x\n"
        "broken.wav,x,x,x,x,x\n"
        "rain.m4a,drops,drops,drops,drops,drops\n"
        "too,many,fields,a,b,c,d\n"
        "empty.wav,,,,,\n"
        "\n"
        "rain.wav,again,a,a,a,a\n"
    )
    return csv, audio, waves


def test_clotho_round_trip(
    clotho: tuple[Path, Path, dict], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    csv, audio, waves = clotho
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        stats = ca.convert_clotho(csv, audio, out, shard_size=3)
    assert stats["written"] == 4
    assert stats["skipped"] == {
        "malformed": 1,
        "no_captions": 1,
        "duplicate_file": 1,
        "missing_audio": 1,
        "unreadable_audio": 1,
    }
    assert stats["skipped_items"]["missing_audio"] == ["gone.wav"]
    assert "broken.wav: not readable as wav" in stats["skipped_items"]["unreadable_audio"][0]
    assert any("broken.wav" in r.getMessage() for r in caplog.records)  # named in the log
    assert f"{csv}:8: skipped (malformed)" in caplog.text  # file and line
    assert [Path(p).name for p in stats["shards"]] == ["development-000000.tar",
                                                       "development-000001.tar"]  # fmt: skip
    assert stats["missing"] == 1 and (out / "development-missing.txt").read_text() == "gone.wav\n"
    samples = _samples(stats["shards"])
    assert list(samples) == ["a_dog_barking", "rain", "street", "rain_2"]  # CSV order
    dog = samples["a_dog_barking"]
    assert dog["meta"]["captions"] == {"en": [f"caption {i}, with a comma" for i in range(1, 6)]}
    assert dog["txt"].decode() == "caption 1, with a comma"
    assert (
        dog["meta"]["file_name"] == "a dog, barking.wav" and dog["meta"]["key"] == "a_dog_barking"
    )
    assert samples["rain"]["meta"]["captions"]["en"][0] == 'rain "falls" on a roof'
    assert samples["street"]["meta"]["captions"] == {"en": ["cars pass"]}
    assert samples["street"]["flac"] == (audio / "street.flac").read_bytes()  # copied as is
    for key, name in [("a_dog_barking", "a dog, barking.wav"), ("rain", "rain.wav"),
                      ("street", "street.flac"), ("rain_2", "rain.m4a")]:  # fmt: skip
        s = samples[key]
        _close(s["wave"], waves[name])
        assert s["rate"] == RATE and s["meta"]["sample_rate"] == RATE
        assert s["meta"]["duration"] == pytest.approx(len(waves[name]) / RATE)
        assert set(s) >= {"flac", "json", "txt"} and not {"wav", "m4a"} & set(s)


def test_clotho_resamples_and_is_deterministic(
    clotho: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    csv, audio, waves = clotho
    a = ca.convert_clotho(csv, audio, tmp_path / "a", split="dev", sample_rate=8000)
    b = ca.convert_clotho(csv, audio, tmp_path / "b", split="dev", sample_rate=8000)
    assert [Path(p).name for p in a["shards"]] == ["dev-000000.tar"]
    assert Path(a["shards"][0]).read_bytes() == Path(b["shards"][0]).read_bytes()
    samples = _samples(a["shards"])
    for s in samples.values():
        assert s["rate"] == 8000 and s["meta"]["sample_rate"] == 8000
        assert len(s["wave"]) == len(waves[s["meta"]["file_name"]]) // 2
    # the flac source at another rate is re-encoded, not copied
    assert samples["street"]["flac"] != (audio / "street.flac").read_bytes()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('file_name,caption_1\nrain.wav,"unclosed\nx.wav,y\n', r"\.csv:3: not a readable CSV"),
        ("name,caption\nrain.wav,x\n", r"the header lacks \['file_name', 'caption_1'\]"),
    ],
)
def test_clotho_bad_csv_is_one_line_error(tmp_path: Path, text: str, match: str) -> None:
    csv = tmp_path / "clotho_captions_evaluation.csv"
    csv.write_text(text)
    with pytest.raises(ValueError, match=match):
        ca.convert_clotho(csv, tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# AudioCaps


def test_audiocaps_groups_captions_and_finds_downloads(tmp_path: Path) -> None:
    audio = tmp_path / "clips"
    audio.mkdir()
    waves = {
        "-dog_x1": _write_audio(audio / "-dog_x1.wav", 1),  # '_' and '-' inside the id
        "cat": _write_audio(audio / "cat_30.m4a", 2),  # <id>_<start>
        "bird": _write_audio(audio / "bird_40000_50000.flac", 3, pcm24=True),  # <id>_<ms>_<ms>
    }
    _write_audio(audio / "bird_10.wav", 4)  # another start: not bird's clip
    _write_audio(audio / "owl_1.wav", 5)
    _write_audio(audio / "owl_2.wav", 6)  # owl: two candidates, neither at its start
    (audio / "cow.wav").write_bytes(CORRUPT)
    (audio / "cat.info.json").write_text("{}")  # downloader leftovers are ignored
    (audio / "hen.webm.part").write_bytes(b"partial")
    csv = tmp_path / "val.csv"
    csv.write_text(
        "audiocap_id,youtube_id,start_time,caption\n"
        "11,-dog_x1,0,a dog barks\n"
        "12,cat,30,a cat meows\n"
        '13,-dog_x1,0,"a dog, then silence"\n'
        "14,bird,40,birds sing\n"
        "15,hen,5,a hen clucks\n"
        "16,cow,0,a cow moos\n"
        "17,owl,7,an owl hoots\n"
        "18,cat,60,another clip of cat\n"
        "19,fox,soon,malformed start\n"
        "20,-dog_x1,0.0,a dog again\n"
    )
    stats = ca.convert_audiocaps(csv, audio, tmp_path / "out")
    assert stats["written"] == 3
    assert stats["skipped"] == {
        "other_start_time": 1,
        "malformed": 1,
        "missing_audio": 1,
        "unreadable_audio": 1,
        "ambiguous_audio": 1,
    }
    assert stats["skipped_items"]["ambiguous_audio"] == ["owl: owl_1, owl_2"]
    assert stats["skipped_items"]["other_start_time"] == [9]
    assert (tmp_path / "out" / "val-missing.txt").read_text() == "hen\t5\n"
    assert stats["missing_list"] == str(tmp_path / "out" / "val-missing.txt")
    samples = _samples(stats["shards"])
    assert list(samples) == ["-dog_x1", "cat", "bird"]
    dog = samples["-dog_x1"]["meta"]
    assert dog["captions"] == {"en": ["a dog barks", "a dog, then silence", "a dog again"]}
    assert dog["audiocap_ids"] == [11, 13, 20] and dog["start_time"] == 0
    assert dog["youtube_id"] == "-dog_x1" and dog["file"] == "-dog_x1.wav"
    assert samples["-dog_x1"]["txt"].decode() == "a dog barks"
    assert samples["cat"]["meta"]["file"] == "cat_30.m4a"
    assert samples["bird"]["meta"]["file"] == "bird_40000_50000.flac"
    assert samples["bird"]["flac"] == (audio / "bird_40000_50000.flac").read_bytes()
    for key, wave in waves.items():
        _close(samples[key]["wave"], wave)


# ---------------------------------------------------------------------------------------------
# ESC-50


def _esc50(tmp_path: Path, rows: list[str]) -> Path:
    root = tmp_path / "ESC-50-master"
    (root / "meta").mkdir(parents=True)
    (root / "audio").mkdir()
    header = "filename,fold,target,category,esc10,src_file,take\n"
    (root / "meta" / "esc50.csv").write_text(header + "".join(f"{r}\n" for r in rows))
    return root


def test_esc50_one_shard_set_per_fold(tmp_path: Path) -> None:
    rows = [
        "1-100-A-0.wav,1,0,dog,True,100,A",
        "1-101-A-2.wav,1,2,rain,False,101,A",
        "2-102-A-1.wav,2,1,rooster,True,102,A",
        "2-103-B-0.wav,2,0,dog,True,103,B",
        "3-104-A-1.wav,3,1,rooster,True,104,A",
        "3-105-A-2.wav,3,2,rain,False,105,A",
        "3-106-A-0.wav,x,0,dog,True,106,A",
    ]
    root = _esc50(tmp_path, rows)
    waves = {}
    for row in rows[:-1]:
        name = row.split(",")[0]
        if name != "3-105-A-2.wav":  # not downloaded
            waves[name] = _write_audio(root / "audio" / name, len(waves), rate=22050)
    out = tmp_path / "esc50"
    stats = ca.convert_esc50(root, out, shard_size=1)
    assert stats["written"] == 5 and stats["classes"] == 3
    assert stats["skipped"] == {"malformed": 1, "missing_audio": 1}
    assert (out / "missing.txt").read_text() == "3-105-A-2.wav\n"
    assert (out / "labels.txt").read_text() == "dog\nrooster\nrain\n"  # line i: target i
    assert {k: v["written"] for k, v in stats["folds"].items()} == {"fold1": 2, "fold2": 2,
                                                                   "fold3": 1}  # fmt: skip
    assert [str(Path(p).relative_to(out)) for p in stats["folds"]["fold2"]["shards"]] == [
        "fold2/fold2-000000.tar",
        "fold2/fold2-000001.tar",
    ]
    for fold in (1, 2, 3):
        samples = _samples(sorted(str(p) for p in (out / f"fold{fold}").glob("*.tar")))
        for key, s in samples.items():
            meta = s["meta"]
            assert meta["fold"] == fold and meta["key"] == key
            assert meta["filename"] == f"{key}.wav"
            assert meta["label"] == int(key[-1]) and isinstance(meta["label"], int)
            assert meta["category"] == ["dog", "rooster", "rain"][meta["label"]]
            assert meta["esc10"] == (meta["category"] != "rain")
            assert s["rate"] == 22050 and "txt" not in s
            _close(s["wave"], waves[meta["filename"]])
    assert _samples(stats["folds"]["fold1"]["shards"])["1-100-A-0"]["meta"]["src_file"] == "100"


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (["a.wav,1,0,dog", "b.wav,1,0,cat"], r"esc50.csv:3: target 0 is 'cat' here but 'dog'"),
        (["a.wav,1,0,dog", "b.wav,1,2,cat"], r"no row names target\(s\) \[1\]"),
    ],
)
def test_esc50_inconsistent_targets_are_errors(tmp_path: Path, rows: list, match: str) -> None:
    root = _esc50(tmp_path, [f"{r},False,1,A" for r in rows])
    with pytest.raises(ValueError, match=match):
        ca.convert_esc50(root, tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# LibriSpeech


@pytest.fixture
def librispeech(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "LibriSpeech" / "dev-clean"
    waves = {}
    layout = {"19": {"198": ["0000", "0001", "0002"]}, "103": {"1240": ["0000", "0005"]}}
    for spk, chapters in layout.items():
        for chap, utts in chapters.items():
            folder = root / spk / chap
            folder.mkdir(parents=True)
            lines = []
            for utt in utts:
                uid = f"{spk}-{chap}-{utt}"
                lines.append(f"{uid} WORDS OF {uid.upper()} IT'S HERE")
                if uid != "19-198-0002":  # a transcript line without audio
                    waves[uid] = _write_audio(folder / f"{uid}.flac", len(waves), pcm24=True)
            (folder / f"{spk}-{chap}.trans.txt").write_text("\n".join(lines) + "\n")
    _write_audio(root / "103" / "1240" / "103-1240-0009.flac", 9)  # no transcript line
    (root / "103" / "1240" / "103-1240-0000.flac").write_bytes(b"fLaC" + b"\x00" * 40)  # corrupt
    del waves["103-1240-0000"]
    with open(root / "19" / "198" / "19-198.trans.txt", "a") as f:
        f.write("19-198-0003\n")  # no transcript: malformed
    return root, waves


def test_librispeech_round_trip(librispeech: tuple[Path, dict], tmp_path: Path) -> None:
    root, waves = librispeech
    out = tmp_path / "out"
    stats = ca.convert_librispeech(root, out)
    assert stats["written"] == 3
    assert stats["skipped"] == {
        "malformed": 1,
        "missing_audio": 1,
        "no_transcript": 1,
        "unreadable_audio": 1,
    }
    assert stats["skipped_items"]["malformed"] == [f"{root / '19' / '198' / '19-198.trans.txt'}:4"]
    assert stats["skipped_items"]["no_transcript"][0].endswith("103-1240-0009.flac")
    assert "103-1240-0000.flac" in stats["skipped_items"]["unreadable_audio"][0]
    assert (out / "dev-clean-missing.txt").read_text() == "19-198-0002\n"
    assert Path(stats["shards"][0]).name == "dev-clean-000000.tar"
    samples = _samples(stats["shards"])
    assert list(samples) == ["19-198-0000", "19-198-0001", "103-1240-0005"]  # numeric order
    for uid, s in samples.items():
        spk, chap, _ = uid.split("-")
        assert s["meta"] == {
            "key": uid,
            "transcript": f"WORDS OF {uid} IT'S HERE",  # as given
            "speaker": spk,
            "chapter": chap,
            "sample_rate": RATE,
            "duration": pytest.approx(0.25),
        }
        assert s["txt"].decode() == s["meta"]["transcript"]
        assert s["flac"] == (root / spk / chap / f"{uid}.flac").read_bytes()
        _close(s["wave"], waves[uid])


def test_librispeech_needs_a_subset_folder(librispeech: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = librispeech
    with pytest.raises(ValueError, match="LibriSpeech/train-clean-100"):
        ca.convert_librispeech(root.parent, tmp_path / "out")


def test_flac_probe_finds_truncated_files(tmp_path: Path) -> None:
    path = tmp_path / "cut.flac"
    path.write_bytes(encode_audio(_wave(0, seconds=1.0), RATE)[:3000])
    data, facts = ca.flac_member(path, probe=False)  # the header looks fine
    assert data == path.read_bytes() and facts["duration"] == 1.0
    with pytest.raises(ValueError, match="cut.flac"):
        ca.flac_member(path)


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_audio_converters(
    clotho: tuple[Path, Path, dict], librispeech: tuple[Path, dict], tmp_path: Path, capsys
) -> None:
    csv, audio, _ = clotho
    out = tmp_path / "cl"
    argv = ["data", "clotho", "--csv", str(csv), "--audio-dir", str(audio), "--out", str(out)]
    assert cli_main([*argv, "--no-progress", "--shard-size", "2"]) == 0
    summary, printed = capsys.readouterr().out.split("\n", 1)
    assert summary.startswith(f"clotho → {out}: wrote 4 clips in 2 shards; skipped 5 (")
    assert summary.endswith(f"missing listed in {out / 'development-missing.txt'}")
    assert json.loads(printed)["missing"] == 1 and "skipped_items" not in json.loads(printed)

    root, _ = librispeech
    argv = ["data", "librispeech", "--root", str(root), "--out", str(tmp_path / "ls")]
    assert cli_main([*argv, "--split", "dev", "--sample-rate", "8000", "--no-progress"]) == 0
    capsys.readouterr()
    assert _samples([str(tmp_path / "ls" / "dev-000000.tar")])["19-198-0000"]["rate"] == 8000

    esc = _esc50(tmp_path, ["1-1-A-0.wav,1,0,dog,True,1,A"])
    _write_audio(esc / "audio" / "1-1-A-0.wav", 0)
    assert cli_main(["data", "esc50", "--root", str(esc), "--out", str(tmp_path / "e")]) == 0
    assert "esc50 → " in capsys.readouterr().out
    assert (tmp_path / "e" / "fold1" / "fold1-000000.tar").is_file()

    ac = tmp_path / "train.csv"
    ac.write_text("audiocap_id,youtube_id,start_time,caption\n1,rain,0,rain falls\n")
    argv = ["data", "audiocaps", "--csv", str(ac), "--audio-dir", str(audio), "--out"]
    assert cli_main([*argv, str(tmp_path / "ac")]) == 0
    assert "wrote 1 clips" in capsys.readouterr().out  # rain.wav (rain.m4a comes after)
    argv = ["data", "audiocaps", "--csv", str(tmp_path / "none.csv"), "--audio-dir"]
    assert cli_main([*argv, str(audio), "--out", str(tmp_path / "x")]) == 2
    assert "none.csv: no such file" in capsys.readouterr().err
