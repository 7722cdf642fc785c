"""Issue 23, the job's inputs before the model loads: the contents of a user's files (calibration
text, JSON lines, prompts, held-out and healing text, image folders) and the hub datasets a job
needs are checked when it is about to run, each problem one line naming the key, the file (and the
line) and what to do, never after the model loaded or with a traceback.

Every test runs offline on an empty Hugging Face cache of its own (deterministic, whatever the
machine has cached)."""

from __future__ import annotations

import json

import pytest
from helpers.config import compose_config
from helpers.integrity_inputs import hf_cache, refusal, spec, written

from replaceme_exp.data import files
from replaceme_exp.errors import ConfigError


TEXT = "\n\n".join(f"Paragraph {i} of a user's own calibration text about pruning blocks. " * 4 for i in range(40))


BINARY = b"\x89PNG\r\n\x1a\n\x00\x00binary"


NUL = "first line\n\nsecond \x00 line".encode()


LATIN1 = "fine\nstill fine\nLatin-1: caf\xe9\n".encode("latin-1")


BAD_TEXT = {
    BINARY: "line 1 is not UTF-8 text (byte 0): a binary file?",
    NUL: "line 3 holds NUL bytes: a binary file, not text",
    LATIN1: "line 3 is not UTF-8 text (byte 28)",
    b"": "holds no text (the file is empty)",
    b"\n  \n\t\n": "holds no text",
}


# Where a job reads a user's text file: the option, and the key naming the file.
CALIBRATION = (["calibration=text_file"], "calibration.path")


EVAL = (["eval.text=text_file"], "eval.path")


HEALING = (["healing=lt_only", "healing/data=text_file", "healing.max_steps=1", "healing.context_length=32"],
           "healing.data.path")  # fmt: skip


PROMPTS = (["calibration=self_generated"], "calibration.prompts_path")


TEXT_CASES = [(CALIBRATION, content) for content in BAD_TEXT] + [
    (EVAL, BINARY),
    (EVAL, b""),
    (HEALING, NUL),
    (HEALING, LATIN1),
    (PROMPTS, LATIN1),
    (PROMPTS, b"\n  \n\t\n"),
]


@pytest.mark.parametrize("where, content", TEXT_CASES)
def test_a_bad_text_file_is_refused_naming_its_key_file_and_line(tmp_path, where, content):
    (options, key), reason = where, BAD_TEXT[content]
    path = written(tmp_path, "mine.txt", content)
    err = refusal(tmp_path, *options, f"{key}={path}")
    assert (err.key, err.value) == (key, str(path))
    assert reason in err.reason
    assert "\n" not in str(err)


def test_text_file_calibration_with_too_few_documents_is_refused_before_the_model_loads(tmp_path):
    path = written(tmp_path, "short.txt", "one paragraph\n\nand another one")
    err = refusal(tmp_path, "calibration=text_file", f"calibration.path={path}", "calibration.n_samples=8")
    assert err.key == "calibration.n_samples" and "holds only 1 documents" in err.reason
    good = written(tmp_path, "good.txt", TEXT)
    spec(tmp_path, "calibration=text_file", f"calibration.path={good}", "calibration.n_samples=8").check_inputs()


def test_an_unreadable_file_is_refused_when_the_configuration_is_resolved(tmp_path, monkeypatch):
    """Before its content enters the config hash (a PermissionError there was a traceback)."""
    path = written(tmp_path, "secret.txt", TEXT)
    real_open = open

    def denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(files, "open", denied, raising=False)
    with pytest.raises(ConfigError, match=r"calibration.path='.*secret.txt': cannot be read \(Permission denied\)"):
        spec(tmp_path, "calibration=text_file", f"calibration.path={path}")


def test_a_big_file_is_checked_in_its_head_before_the_model_loads_and_whole_when_read(tmp_path, monkeypatch):
    from replaceme_exp.data.sources import text_file_documents

    monkeypatch.setattr(files, "PREFLIGHT_BYTES", 4096)
    path = written(tmp_path, "big.txt", TEXT.encode() + b"\n\nbinary tail \xff\xfe")
    assert path.stat().st_size > 2 * 4096
    spec(tmp_path, "calibration=text_file", f"calibration.path={path}").check_inputs()  # the head is text
    with pytest.raises(ConfigError, match=r"calibration.path=.*: line 81 is not UTF-8 text"):
        text_file_documents(str(path), 1000)
    early = written(tmp_path, "early.txt", b"binary \xff\xfe\n\n" + TEXT.encode())
    assert "line 1 is not UTF-8" in refusal(tmp_path, "calibration=text_file", f"calibration.path={early}").reason


def test_a_utf8_character_split_between_two_reads_is_text(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_CHUNK", 3)
    path = written(tmp_path, "umlauts.txt", "Grüße aus Köln — ok\nzweite Zeile: éèê\n")
    reader = files.TextFile("k", str(path), path)
    assert [line for _, line in reader.lines()] == ["Grüße aus Köln — ok", "zweite Zeile: éèê"]
    assert reader.complete


BAD_JSONL = [
    (['{"text": "fine"}', '{"text": "broken'], "calibration.path", "line 2 is not valid JSON"),
    (['{"text": "fine"}', "[1, 2]"], "calibration.path", "line 2 is not a JSON object"),
    (['{"text": "fine"}', '{"body": "no text field"}'], "calibration.text_field",
     "line 2 of {path}: record has neither text field 'text' nor chat field 'messages'; its keys: ['body']"),
    (['{"messages": "a string"}'], "calibration.chat_field", "line 1 of {path}: must hold a list of turns"),
    (['{"text": "a", "meta": ' + "[" * 40 + "]" * 40 + "}"], "calibration.path",
     "line 1 is nested deeper than 32 levels"),
    (['{"text": ' + "[" * 5000 + "]" * 5000 + "}"], "calibration.path", "line 1 is nested deeper than 32 levels"),
    ([], "calibration.path", "holds no record"),
    (["", "   "], "calibration.path", "holds no record"),
]  # fmt: skip


@pytest.mark.parametrize("lines, key, reason", BAD_JSONL)
def test_a_bad_jsonl_file_is_refused_naming_the_file_and_line(tmp_path, lines, key, reason):
    path = written(tmp_path, "calib.jsonl", "\n".join(lines))
    err = refusal(tmp_path, "calibration=jsonl", f"calibration.path={path}")
    assert err.key == key and reason.format(path=path) in err.reason, str(err)
    assert err.value == str(path) or key != "calibration.path"


def test_a_non_utf8_jsonl_line_is_named(tmp_path):
    path = written(tmp_path, "calib.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert "line 2 is not UTF-8 text" in refusal(tmp_path, "calibration=jsonl", f"calibration.path={path}").reason


@pytest.mark.parametrize(
    "content, reason",
    [("", "holds no record"), ('{"text": "a", "x": ' + "[" * 70 + "]" * 70 + "}", "nested deeper than 32 levels")],
)
def test_jsonl_that_datasets_cannot_read_is_refused_in_one_line_when_read(tmp_path, smollm2_tokenizer, content, reason):
    """Where ``datasets`` raised StopIteration (empty) or pyarrow's DatasetGenerationError (64 levels)."""
    from replaceme_exp.config.validate import typed_config
    from replaceme_exp.data import build_calibration

    path = written(tmp_path, "calib.jsonl", content)
    cfg = typed_config(compose_config(["calibration=jsonl", f"calibration.path={path}", "calibration.n_samples=1"]))
    with pytest.raises(ConfigError, match=reason):
        build_calibration(cfg.calibration, smollm2_tokenizer)


def test_good_jsonl_passes_and_each_mix_part_is_checked(tmp_path):
    chat = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
    path = written(tmp_path, "calib.jsonl", "\n".join(json.dumps(r) for r in [{"text": "plain"}, chat]))
    spec(tmp_path, "calibration=jsonl", f"calibration.path={path}").check_inputs()
    bad = written(tmp_path, "bad.txt", b"\xff\xfe")
    mix = [
        "calibration=slimorca_fineweb",
        "calibration.n_samples=8",
        "+calibration.parts.mine={fraction: 0.5, source: text_file, path: " + str(bad) + "}",
    ]
    err = refusal(tmp_path, *mix)
    assert err.key == "calibration.parts.mine.path" and "not UTF-8" in err.reason


def test_prompt_files_are_checked_before_the_model_answers_them(tmp_path):
    lines = written(tmp_path, "prompts.jsonl", '{"prompt": "A?"}\n{"text": "B?"}\n')
    err = refusal(tmp_path, "calibration=self_generated", f"calibration.prompts_path={lines}")
    assert err.key == "calibration.prompts_path" and "line 2: no JSON prompt (no 'prompt' field" in err.reason
    few = written(tmp_path, "few.txt", "First?\nSecond?\n")
    err = refusal(tmp_path, "calibration=self_generated", f"calibration.prompts_path={few}", "calibration.n_samples=3")
    assert err.key == "calibration.n_samples" and "holds only 2 prompts" in err.reason
    orca = written(tmp_path, "orca.jsonl", json.dumps({"conversations": [{"from": "gpt", "value": "no user turn"}]}))
    local = ["calibration=orca_generated", "calibration.prompts_dataset=json", f"calibration.prompts_data_files={orca}"]
    err = refusal(tmp_path, *local, "calibration.streaming=false", "calibration.n_samples=1")
    assert err.key == "calibration.prompts_chat_field"
    assert f"line 1 of {orca}: a conversation has no user turn" in err.reason


def test_non_utf8_prompts_are_one_line_when_read(tmp_path):
    from replaceme_exp.data.generated import load_prompts

    path = written(tmp_path, "prompts.txt", "Fine?\nCaf\xe9?\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"calibration.prompts_path=.*: line 2 is not UTF-8 text"):
        load_prompts(str(path))


VISION = ["model=tiny_clip", "calibration=image_folder", "eval=clip_offline", "cuts=[[1,2]]"]


def image_folder(tmp_path, *names):
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    for i, name in enumerate(names):
        Image.new("RGB", (20 + i, 30), color=(10 * i, 90, 200)).save(folder / name)
    return folder


def test_an_image_folder_is_checked_by_its_headers(tmp_path, monkeypatch):
    from PIL import Image

    folder = image_folder(tmp_path, "a.png", "b.jpg")
    spec(tmp_path, *VISION, f"calibration.path={folder}").check_inputs()
    (folder / "broken.png").write_bytes(b"not an image at all")
    err = refusal(tmp_path, *VISION, f"calibration.path={folder}")
    assert err.key == "calibration.path" and err.reason.startswith("broken.png is not an image PIL can read")
    (folder / "broken.png").unlink()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 610)  # a 21 x 30 image is a bomb now, 20 x 30 not
    err = refusal(tmp_path, *VISION, f"calibration.path={folder}")
    assert "b.jpg has 21 x 30 pixels, more than PIL's limit of 610" in err.reason
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200)  # past twice the limit PIL refuses to open it
    assert "could be decompression bomb" in refusal(tmp_path, *VISION, f"calibration.path={folder}").reason
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no image file" in refusal(tmp_path, *VISION, f"calibration.path={empty}").reason


def test_an_image_that_does_not_decode_passes_the_header_check_and_is_one_line_when_read(tmp_path):
    from replaceme_exp.data.images import folder_images

    folder = image_folder(tmp_path, "a.png")
    png = (folder / "a.png").read_bytes()
    (folder / "cut.png").write_bytes(png[: len(png) // 2])  # a whole header, half the pixels
    spec(tmp_path, *VISION, f"calibration.path={folder}").check_inputs()  # headers only: nothing decoded
    with pytest.raises(ConfigError, match=r"calibration.path=.*: cut.png cannot be decoded \(") as err:
        folder_images(str(folder))
    assert "\n" not in str(err.value)


OFFLINE = "HF_DATASETS_OFFLINE=1 keeps the job offline: run it online, or cache it once online"


HUB_NEEDS = [
    (["eval=paper"], "eval.harness.tasks", "race", "the hub dataset EleutherAI/race (high)", "eval=offline"),
    (["healing=lt_only"], "healing.data.dataset", "allenai/c4", "the hub dataset allenai/c4 (en)",
     "healing/data=pydoc"),
    (["calibration=slimorca"], "calibration.dataset", "Open-Orca/SlimOrca", "Open-Orca/SlimOrca", "calibration=pydoc"),
    (["calibration=orca_generated"], "calibration.prompts_dataset", "Open-Orca/SlimOrca", "Open-Orca/SlimOrca",
     "calibration=self_generated"),
    (["calibration=slimorca_fineweb"], "calibration.parts.slimorca.dataset", "Open-Orca/SlimOrca",
     "Open-Orca/SlimOrca", "calibration=pydoc"),
    (["model=tiny_clip", "calibration=hub_images", "calibration.dataset=owner/mimic", "eval=clip_offline",
      "cuts=[[1,2]]"], "calibration.dataset", "owner/mimic", "owner/mimic", "calibration=image_folder"),
    (["model=tiny_clip", "calibration=bundled_images", "eval=clip", "cuts=[[1,2]]"], "eval.benchmarks",
     "mscoco_captions", "clip-benchmark/wds_mscoco_captions", "eval=clip_offline"),
    (["eval=llama2_table"], "eval.harness.tasks", "replaceme_c3", "clue/clue (c3)", "eval=offline"),
    (["job=evaluate", "eval=sciq"], "eval.harness.tasks", "sciq", "allenai/sciq", "eval=offline"),
]  # fmt: skip


@pytest.mark.parametrize("options, key, value, dataset, instead", HUB_NEEDS)
def test_a_hub_dataset_missing_offline_is_named_with_what_to_do(tmp_path, hf_cache, options, key, value, dataset,
                                                                instead):  # fmt: skip
    err = refusal(tmp_path, *options)
    assert (err.key, err.value) == (key, value)
    assert dataset in err.reason and f"not in the local datasets cache ({hf_cache})" in err.reason
    assert OFFLINE in err.reason and instead in err.reason and "\n" not in str(err)


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["eval=offline"],
        ["calibration=pydoc_chat", "eval=quick"],
        ["calibration=self_generated"],
        ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", "cuts=[[1,2]]"],
        ["healing=lt_only", "healing/data=pydoc", "healing.max_steps=1", "healing.context_length=32"],
    ],
)
def test_what_ships_with_the_project_passes_offline_on_an_empty_cache(tmp_path, options):
    spec(tmp_path, *options).check_inputs()


def test_online_an_unreachable_hub_or_an_unknown_dataset_is_named(tmp_path, monkeypatch):
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    asked = []

    def unreachable(self, repo_id, **kwargs):
        asked.append(repo_id)
        raise httpx2.ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    err = refusal(tmp_path, "healing=lt_only")
    assert err.key == "healing.data.dataset" and asked == ["allenai/c4"]
    assert "not in the local cache, and the hub cannot be reached (ConnectError: [Errno -3]" in err.reason

    def unknown(self, repo_id, **kwargs):
        response = httpx2.Response(404, request=httpx2.Request("GET", f"https://hub/api/datasets/{repo_id}"))
        raise RepositoryNotFoundError("404", response=response)

    monkeypatch.setattr(HfApi, "dataset_info", unknown)
    assert "is not a dataset on the hub" in refusal(tmp_path, "calibration=slimorca").reason
    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kwargs: object())
    spec(tmp_path, "calibration=slimorca", "healing=lt_only").check_inputs()


def test_an_unknown_lm_eval_task_is_refused(tmp_path, monkeypatch):
    from replaceme_exp.config.schema import HarnessConfig
    from replaceme_exp.evaluation import task_datasets

    suite = HarnessConfig(tasks={"piqa": 0, "no_such_task_xyz": 0}, metrics={"piqa": "acc", "no_such_task_xyz": "acc"})
    partial = task_datasets._partial_index  # lm-eval's full index (10 s to build) knows it not either:
    monkeypatch.setattr(task_datasets, "_full_index", lambda roots: partial({"piqa", "no_such_task_xyz"}, roots))
    with pytest.raises(ConfigError, match=r"eval.harness.tasks='no_such_task_xyz': is not an lm-eval task, group"):
        task_datasets.suite_datasets(suite)

    def moved(names, roots):
        raise ImportError("No module named 'lm_eval.tasks._index'")

    monkeypatch.setattr(task_datasets, "_partial_index", moved)  # another lm-eval: its full index alone
    piqa = HarnessConfig(tasks={"piqa": 0}, metrics={"piqa": "acc_norm"})
    assert [(d.value, d.path) for d in task_datasets.suite_datasets(piqa)] == [("piqa", "baber/piqa")]


def test_a_random_models_tokenizer_other_than_embedded_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^model.tokenizer='bogus': choose one of embedded$"):
        spec(tmp_path, "model.tokenizer=bogus")
