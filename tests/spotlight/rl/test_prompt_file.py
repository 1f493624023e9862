"""Prompt files as users bring them (`spotlight.rl.prompt_file`): txt, jsonl with metadata, flow_grpo
dataset folders; and every broken form is one line naming the file and line."""

import json
import subprocess
import sys

import pytest

from spotlight.config import ConfigError, default_config
from spotlight.rl.prompt_file import EVAL_PROMPT_ID0, evaluation_prompts, read_prompts, run_prompts


def test_a_txt_file_is_one_prompt_a_line_blank_lines_skipped(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text('A sign that says "OPEN"\r\n\n  a cat on a mat  \n')
    prompts = read_prompts(path)
    assert [(p.id, p.text, p.metadata) for p in prompts] == [(0, 'A sign that says "OPEN"', {}), (1, "a cat on a mat", {})]


def test_a_byte_order_mark_and_any_line_ending_are_read_as_an_editor_shows_them(tmp_path):
    """Issue 41, item 13: a UTF-8 BOM stayed in prompt 0 (an OCR or colour prompt then named none of
    its words), and CR-only line endings made the whole file one prompt."""
    path = tmp_path / "p.txt"
    path.write_bytes('\ufeffa red image\ra blue image\r\na green image\n'.encode())
    assert [(p.text, p.line) for p in read_prompts(path)] == [("a red image", 1), ("a blue image", 2),
                                                               ("a green image", 3)]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes('\ufeff{"prompt": "a\\u2028b"}\r{"prompt": "c"}\r'.encode())
    assert [p.text for p in read_prompts(jsonl)] == ["a\u2028b", "c"]  # an escaped separator stays in its prompt


def test_a_jsonl_file_keeps_the_other_fields_as_metadata(tmp_path):
    # GenEval's metadata lines, and a GSM8K-style line whose answer holds a U+2028 (a JSON string may).
    rows = [{"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
            {"prompt": "What is 2+2?", "answer": "2+2\u2028= 4 #### 4"}]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    a, b = read_prompts(path)
    assert a.text == "a photo of a bench" and a.metadata == {"tag": "single_object", "include": [{"class": "bench", "count": 1}]}
    assert b.id == 1 and b.metadata == {"answer": "2+2\u2028= 4 #### 4"}


def test_a_flow_grpo_dataset_folder_reads_as_it_is(tmp_path):
    (tmp_path / "train.txt").write_text('a sign "A"\na sign "B"\n')
    (tmp_path / "test.txt").write_text('a sign "C"\na sign "D"\na sign "E"\n')
    cfg = default_config({"prompts": {"path": str(tmp_path)}, "warm_start": {"steps": 0}})
    train = run_prompts(cfg.prompts, cfg.seed)
    assert [p.text for p in train] == ['a sign "A"', 'a sign "B"']
    assert evaluation_prompts(cfg, train) == []  # evaluation is off until asked for
    cfg = default_config({"prompts": {"path": str(tmp_path)}, "train": {"eval_prompts": 2}, "warm_start": {"steps": 0}})
    held_out = evaluation_prompts(cfg, train)
    assert [(p.id, p.text) for p in held_out] == [(EVAL_PROMPT_ID0, 'a sign "C"'), (EVAL_PROMPT_ID0 + 1, 'a sign "D"')]
    # The metadata file comes first when a folder has both (GenEval's layout).
    (tmp_path / "train_metadata.jsonl").write_text('{"prompt": "x", "tag": "t"}\n')
    assert read_prompts(tmp_path)[0].metadata == {"tag": "t"}


def test_evaluation_completions_name_each_prompts_file_line_beside_its_id(tmp_path):
    from types import SimpleNamespace

    import torch

    from spotlight.train.eval_samples import write_evaluation

    (tmp_path / "eval.txt").write_text("1+2=\n\n3+4=\n")  # a blank line: ids skip it, file lines do not
    cfg = default_config({"prompts": {"eval_path": str(tmp_path / "eval.txt")}})
    prompts = [p for p in evaluation_prompts(cfg, []) for _ in range(2)]  # two seeds each
    rollout = SimpleNamespace(images=None, prompts=prompts, seeds=[0, 1, 0, 1], completions=["3", "4", "7", "7"])
    path = write_evaluation(tmp_path / "eval", 4, rollout, 2, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["prompt"], r["line"], r["prompt_id"], r["seed"]) for r in rows] == [
        ("1+2=", 1, EVAL_PROMPT_ID0, 0), ("1+2=", 1, EVAL_PROMPT_ID0, 1),
        ("3+4=", 3, EVAL_PROMPT_ID0 + 1, 0), ("3+4=", 3, EVAL_PROMPT_ID0 + 1, 1)]
    assert EVAL_PROMPT_ID0 == 4294967296  # the figure docs/training.md explains


def test_an_eval_file_is_used_whole_unless_eval_prompts_limits_it(tmp_path):
    (tmp_path / "eval.txt").write_text("one\ntwo\nthree\n")
    cfg = default_config({"prompts": {"eval_path": str(tmp_path / "eval.txt")}})
    assert [p.text for p in evaluation_prompts(cfg, [])] == ["one", "two", "three"]
    cfg = default_config({"prompts": {"eval_path": str(tmp_path / "eval.txt")}, "train": {"eval_prompts": 1}})
    assert [p.text for p in evaluation_prompts(cfg, [])] == ["one"]


@pytest.mark.parametrize("name, content, message", [
    ("p.txt", "", "holds no prompts"),
    ("p.txt", "\n  \n", "holds no prompts"),
    ("p.txt", b"ok\n\xff\xfe\n", "not a UTF-8 text file"),
    ("p.txt", b"a\x00b\n", "a binary file"),
    ("p.txt", "ok\n" + "x" * 10_001 + "\n", "p.txt:2: a prompt of 10,001 characters (expected at most 10,000)"),
    ("p.jsonl", '{"prompt": "ok"}\n{"prompt": 3}\n', 'p.jsonl:2: expected a JSON object with a non-empty "prompt" string'),
    ("p.jsonl", '{"prompt": "ok"}\n\n{"text": "no prompt"}\n', "p.jsonl:3: expected a JSON object"),
    ("p.jsonl", '{"prompt": "ok"}\n{"prompt": "a", "prompt": "b"}\n', "p.jsonl:2: duplicate key"),
    ("p.jsonl", '{"prompt": "ok", \n', "p.jsonl:1: not JSON"),
    ("p.jsonl", '{"prompt": "x", "w": NaN}\n', "p.jsonl:1: NaN is not a JSON number"),
    ("p.csv", "a,b\n", "expected a .txt file (one prompt a line), a .jsonl file"),
])
def test_a_bad_prompt_file_is_one_line_naming_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as err:
        read_prompts(path)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_missing_files_and_folders_without_a_training_file_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="no such file or folder"):
        read_prompts(tmp_path / "absent.txt")
    with pytest.raises(ConfigError, match=r"a folder without train_metadata.jsonl or train.txt"):
        read_prompts(tmp_path)
    with pytest.raises(ConfigError) as err:  # a newline in a file name forges no second error line
        read_prompts(tmp_path / "a\nspotlight: error: forged.txt")
    assert "\n" not in str(err.value)


def test_spotlight_train_refuses_a_bad_prompt_file_before_anything_starts(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a red image"}\n["not", "an object"]\n')
    (tmp_path / "run.yaml").write_text(f"prompts:\n  path: {tmp_path / 'p.jsonl'}\n")
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(tmp_path / "run.yaml"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"spotlight: error: {tmp_path / 'run.yaml'}: {tmp_path / 'p.jsonl'}:2: expected a JSON object with a "
        "non-empty \"prompt\" string (prompts.text_field), got ['not', 'an object']"]
    assert not (tmp_path / "out").exists()


def test_the_synthetic_warm_start_refuses_prompts_naming_no_colour(tmp_path):
    from spotlight.rl.warm_start import apply_warm_start

    # prompt 1 is on the file's line 3 (ids skip blank lines): the error names the line (issue 42)
    (tmp_path / "p.txt").write_text("a red image\n\na sign that says hello\n")
    cfg = default_config({"prompts": {"path": str(tmp_path / "p.txt")}, "warm_start": {"cache_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"and .*p.txt line 3 \('a sign that says hello'\) names none of red, "):
        apply_warm_start(None, cfg, run_prompts(cfg.prompts, cfg.seed))


def test_a_file_edited_between_two_reads_is_read_again(tmp_path):
    # Parsed once per process while the file is unchanged (a run asks several times before it starts).
    path = tmp_path / "p.txt"
    path.write_text("one\ntwo\n")
    assert [p.text for p in read_prompts(path)] == ["one", "two"]
    path.write_text("three\n")
    assert [p.text for p in read_prompts(path)] == ["three"]
    assert read_prompts(path) is not read_prompts(path)  # each caller gets its own list


def test_gsm8k_files_name_their_prompt_field_question(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = 5\n#### 5"}) + "\n")
    cfg = default_config({"policy": {"kind": "llm"}, "reward": {"name": "answer_match"},
                          "prompts": {"path": str(path), "text_field": "question"}})
    (p,) = run_prompts(cfg.prompts, cfg.seed)
    assert p.text.startswith("Tom has") and p.metadata == {"answer": "3 + 2 = 5\n#### 5"}
    with pytest.raises(ConfigError, match=r'non-empty "prompt" string \(prompts.text_field\)'):
        read_prompts(path)
