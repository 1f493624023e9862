"""Every command ends bad input the same way (issue 13): exit 2, exactly one stderr line of at most
300 characters starting `spotlight: error:`, no traceback, nothing created, within 10 s and 500 MB.
The line holds no control character, whatever the input: a newline or an escape sequence in a key
or a file name is shown escaped (`\\n`, `\\x1b`), never forges a second line or reaches the terminal.

Each case runs the real CLI in a fresh, empty working directory (so nothing can land in the
repo), with CI=true and no stdin; the files a case needs are written there first, and afterwards
the directory must hold exactly those files. The child's peak memory is its own VmHWM, which it
reports as it exits (`ru_maxrss` from wait4 would not do: Linux carries the forking process's
high-water mark into the child through fork and exec, so after a memory-hungry test file in the
same pytest process every case failed at 650-700 MB), and an address-space limit of 2 GiB stops
a regression that would fill the machine before the assertion could. `expect` is a piece of the error line: the case fails for the right
reason, not for any reason.
"""

from __future__ import annotations

import os
import resource
import unicodedata
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli_peak import PEAK_REPORTING_CLI

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "experiments" / "traces" / "bamboo-g4dn.csv")

LIMIT_S = 10.0
LIMIT_MB = 500
ADDRESS_SPACE = 2 << 30
"""RLIMIT_AS of the child: torch's import maps ~0.8 GB; 2 GiB leaves room and stops a runaway."""


class _Fifo:
    """The content of a `Case` file that is a FIFO (named pipe) rather than a regular file."""


FIFO = _Fifo()


class _Symlink:
    """The content of a `Case` file that is a symbolic link (to a path that does not exist)."""


SYMLINK = _Symlink()


_LLM = "policy:\n  kind: llm\nreward:\n  name: arithmetic\n"
"""A tiny-LLM run config's start (the character tokenizer: digits and + - = only)."""


@dataclass
class Case:
    id: str
    argv: list[str]
    expect: str
    """A piece of the error line."""
    files: dict[str, str | bytes | _Fifo] = field(default_factory=dict)
    """Inputs written into the working directory first (a name ending in / is a folder, `FIFO` as
    the content makes a named pipe with no writer: opening it would wait forever)."""


def _bomb() -> str:
    """The billion-laughs alias bomb of issue 13 (332 bytes there), every anchor inside `seed:`:
    nine levels of nine references expand to 9**9 = 387M strings."""
    levels = ['  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"  - &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "seed:\n" + "\n".join(levels) + "\n"


BINARY = bytes(range(256)) * 4
"""Not UTF-8, and with NUL bytes: a PNG or a checkpoint given by mistake."""
DEEP_YAML = "seed: " + "[" * 100_000 + "]" * 100_000 + "\n"
DEEP_JSON = '{"metadata": {"gap_seconds": 60}, "data": ' + "[" * 100_000 + "]" * 100_000 + "}"
DEEP_JSON_CONFIG = '{"train": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}"
VALID = "seed: 3\n"
FLEET = "runtime:\n  spot_workers: 2\ncloud:\n  gpu: H100\n"

# ---- the cases: (id, argv, a piece of the expected line, input files) -------------------------------

TRAIN = [
    Case("binary config", ["train", "c.yaml"], "c.yaml: a binary file", {"c.yaml": BINARY}),
    Case("latin-1 config", ["train", "c.yaml"], "not a UTF-8 text file", {"c.yaml": "seed: 1 # café\n".encode("latin-1")}),
    Case("100k-deep YAML", ["train", "c.yaml"], "nested deeper than 64 levels", {"c.yaml": DEEP_YAML}),
    Case("100k-deep JSON config", ["train", "c.json"], "nested deeper than 64 levels", {"c.json": DEEP_JSON_CONFIG}),
    Case("alias bomb", ["train", "c.yaml"], "anchors and aliases are not accepted", {"c.yaml": _bomb()}),
    Case("duplicate keys", ["train", "c.yaml"], "line 3: duplicate key 'seed'",
         {"c.yaml": "seed: 1\ndevice: cpu\nseed: 2\n"}),
    Case("empty config", ["train", "c.yaml"], "c.yaml: empty config file", {"c.yaml": ""}),
    Case("comment-only config", ["train", "c.yaml"], "c.yaml: empty config file", {"c.yaml": "# nothing\n"}),
    Case("config is a list", ["train", "c.yaml"], "expected a mapping of RunConfig fields", {"c.yaml": "- 1\n"}),
    Case("config is a folder", ["train", "conf/"], "is a folder", {"conf/": ""}),
    Case("missing config", ["train", "nope.yaml"], "nope.yaml: no such config file"),
    Case("--out an existing file", ["train", "--out", "taken", "--runtime", "local"],
         "--out: taken is an existing file", {"taken": "x"}),
    Case("--out inside a file", ["train", "--out", "taken/run", "--runtime", "local"],
         "inside the file taken", {"taken": "x"}),
    Case("seed: 1e23", ["train", "c.yaml"], "seed: expected an integer, got '1e23'", {"c.yaml": "seed: 1e23\n"}),
    Case("seed: 1.0e+23", ["train", "c.yaml"], "seed: expected an integer, got 1e+23", {"c.yaml": "seed: 1.0e+23\n"}),
    Case("huge int seed", ["train", "c.yaml"], "seed: expected an integer in [0, 4294967295]",
         {"c.yaml": "seed: 123456789012345678901234567890\n"}),
    Case("5000-digit seed", ["train", "c.yaml"], "an integer of 5000 digits", {"c.yaml": "seed: " + "9" * 5000 + "\n"}),
    Case("5000-digit --seed", ["train", "--seed", "9" * 5000], "argument --seed: expected an integer"),
    Case("negative seed", ["train", "--seed", "-1"], "seed: expected an integer in [0, 4294967295], got -1"),
    Case("device: banana", ["train", "c.yaml"], "device: expected cpu, cuda, cuda:N or mps, got 'banana'",
         {"c.yaml": "device: banana\n"}),
    Case("missing pretrained_path", ["train", "c.yaml"], "policy.dit.pretrained_path: 'no/such/weights' is not an "
         "existing folder", {"c.yaml": "policy:\n  dit:\n    pretrained_path: no/such/weights\n"}),
    Case("missing reward.model_path", ["train", "c.yaml"], "reward.model_path: 'no/clip' is not an existing folder",
         {"c.yaml": "reward:\n  name: clip_score\n  model_path: no/clip\n"}),
    Case("train.lr: .inf", ["train", "c.yaml"], "train.lr: expected a finite number, got inf",
         {"c.yaml": "train:\n  lr: .inf\n"}),
    Case("grpo.adv_clip: .nan", ["train", "c.yaml"], "grpo.adv_clip: expected a finite number, got nan",
         {"c.yaml": "grpo:\n  adv_clip: .nan\n"}),
    Case("float beyond float's range", ["train", "c.yaml"], "train.lr: expected a finite number",
         {"c.yaml": "train:\n  lr: 1.0e+999\n"}),
    Case("train.steps: 10**9", ["train", "c.yaml"], "train.steps: expected at most 1,000,000",
         {"c.yaml": "train:\n  steps: 1000000000\n"}),
    Case("group of 10**6 samples", ["train", "c.yaml"], "train.group_size: expected at most 4,096",
         {"c.yaml": "train:\n  group_size: 1000000\n"}),
    Case("reward.name: bogus", ["train", "c.yaml"], "c.yaml: reward.name: expected one of", {"c.yaml": "reward:\n  name: bogus\n"}),
    Case("a date where a number goes", ["train", "c.yaml"], "line 2: cannot read this value",
         {"c.yaml": "train:\n  lr: 2024-13-45\n"}),
    Case("non-string keys", ["train", "c.yaml"], "1: unknown field", {"c.yaml": "1: 2\nfoo: 3\n"}),
    Case("--checkpoint-uri file:///etc", ["train", "--checkpoint-uri", "file:///etc"],
         "cloud.checkpoint_uri: file:///etc: a folder store outside the allowed folders"),
    Case("--budget-usd nan", ["train", "--budget-usd", "nan"], "argument --budget-usd: expected a finite number, got 'nan'"),
    Case("--deadline-h -1", ["train", "--deadline-h", "-1"], "--deadline-h: expected a number > 0, got -1"),
    Case("--trace-speedup -2", ["train", "--trace-speedup", "-2"], "argument --trace-speedup: expected a finite number > 0"),
    Case("--preemption-trace binary", ["train", "--preemption-trace", "t.csv"], "t.csv: a binary file", {"t.csv": BINARY}),
    Case("--preemption-trace 3e8 nodes", ["train", "--preemption-trace", "t.csv"], "more than 65,536 nodes",
         {"t.csv": "t_s,nodes\n10,300000000\n"}),
    Case("--device cuda without CUDA", ["train", "--device", "cuda", "--runtime", "local"],
         "--device: cuda, but torch"),
    Case("cloud.gpu: H900", ["train", "c.yaml", "--runtime", "local"], "cloud.gpu", {"c.yaml": "cloud:\n  gpu: H900\n"}),
    Case("newline in a config key", ["train", "c.yaml"], "c.yaml: a\\nspotlight: error: forged: unknown field",
         {"c.yaml": '"a\\nspotlight: error: forged": 1\n'}),
    Case("ESC in a config key", ["train", "c.yaml"], "c.yaml: \\x1b[2J\\x1b[31mred: unknown field",
         {"c.yaml": '"\\e[2J\\e[31mred": 1\n'}),
    Case("U+2028 and a bidi override in a config key", ["train", "c.yaml"], "c.yaml: a\\u2028b\\u202ec: unknown field",
         {"c.yaml": '"a\\u2028b\\u202ec": 1\n'}),
    Case("newline in a config file name", ["train", "c\nspotlight: error: forged.yaml"],
         "c\\nspotlight: error: forged.yaml: a binary file", {"c\nspotlight: error: forged.yaml": BINARY}),
    Case("ESC in a config file name", ["train", "\x1b[2Jc.yaml"], "\\x1b[2Jc.yaml: seed: expected an integer",
         {"\x1b[2Jc.yaml": "seed: x\n"}),
    Case("config is a FIFO", ["train", "c.yaml"], "c.yaml: a FIFO (named pipe), not a regular file", {"c.yaml": FIFO}),
    Case("config is /dev/zero", ["train", "/dev/zero"], "/dev/zero: a character device, not a regular file"),
    Case("--preemption-trace a FIFO", ["train", "--preemption-trace", "t.csv", "--runtime", "ray"], "t.csv: a FIFO",
         {"t.csv": FIFO}),
    Case("prompts.path a FIFO", ["train", "c.yaml", "--runtime", "local"], "prompts.path: p.txt: a FIFO",
         {"c.yaml": "prompts:\n  path: p.txt\n", "p.txt": FIFO}),
    # issue 42: trained at reward 0.000 -> 0.000 without a word; now the file line of the first one
    Case("tiny LLM, prompt it cannot read", ["train", "c.yaml", "--runtime", "local"],
         "prompts.path: 'p.txt' line 3: the tiny LLM's tokenizer cannot read 'w' in 'what is 3+4?' (it reads only "
         "0123456789+-=", {"c.yaml": _LLM + "prompts:\n  path: p.txt\n", "p.txt": "1+2=\n\nwhat is 3+4?\n"}),
    Case("tiny LLM, eval prompt it cannot read", ["train", "c.yaml", "--runtime", "local"],
         "prompts.eval_path: 'e.txt' line 2: the tiny LLM's tokenizer cannot read ' ' in '2 + 2='",
         {"c.yaml": _LLM + "prompts:\n  path: p.txt\n  eval_path: e.txt\n", "p.txt": "1+2=\n", "e.txt": "3+4=\n2 + 2=\n"}),
    Case("train: [1, 2] with --steps", ["train", "c.yaml", "--steps", "1"],
         "c.yaml: train: expected a mapping of TrainConfig fields, got [1, 2]", {"c.yaml": "train: [1, 2]\n"}),
    Case("train: null with --steps", ["train", "c.yaml", "--steps", "1"],
         "c.yaml: train: expected a mapping of TrainConfig fields, got None", {"c.yaml": "train:\nseed: 1\n"}),
    Case("cloud: a string with --checkpoint-uri", ["train", "c.yaml", "--checkpoint-uri", "s3://b/p"],
         "c.yaml: cloud: expected a mapping of CloudConfig fields, got 'aws'", {"c.yaml": "cloud: aws\n"}),
    # /proc refuses a new folder even to root, for whom a chmod'ed folder is writable
    # (tests/spotlight/test_input_hygiene.py has the chmod case, for other users).
    Case("--out on /proc", ["train", "--out", "/proc/spotlight-out/run", "--runtime", "local"],
         "--out: /proc/spotlight-out/run cannot be written (making a folder in /proc)"),
    # issue 27: in range field by field, beyond the machine as a whole (`spotlight.memory_estimate`)
    Case("a 7B-shaped LLM", ["train", "c.yaml", "--runtime", "local"], "the run needs about",
         {"c.yaml": "policy:\n  kind: llm\n  llm: {hidden_size: 4096, num_layers: 32, num_heads: 32, num_kv_heads: 8, "
                    "intermediate_size: 14336}\nreward: {name: arithmetic}\nprompts: {name: arithmetic}\n"}),
    Case("the tiny DiT at 4096 px", ["train", "c.yaml", "--runtime", "local"], "the run needs about",
         {"c.yaml": "policy:\n  dit:\n    resolution: 4096\n"}),
    Case("100k-deep cost.json in --out", ["train", "--out", "run", "--runtime", "local"],
         "run/cost.json: expected {\"cost_usd\"", {"run/": "", "run/cost.json": DEEP_JSON}),
]

SIMULATE = [
    Case("--gpus 1000000000", ["simulate", "--trace", TRACE, "--gpus", "1000000000"],
         "--gpus: gpus: expected an integer in [1, 16,384]"),
    Case("--notice-s -5", ["simulate", "--trace", TRACE, "--notice-s", "-5"], "--notice-s: notice_s: expected a number >= 0"),
    Case("--iterations-scale nan", ["simulate", "--trace", TRACE, "--iterations-scale", "nan"],
         "argument --iterations-scale: expected a finite number > 0, got 'nan'"),
    Case("--budget-usd inf", ["simulate", "--trace", TRACE, "--budget-usd", "inf"], "argument --budget-usd: expected a finite"),
    Case("--gpu H900", ["simulate", "--trace", TRACE, "--gpu", "H900"], "--gpu: step_times.gpu: expected a GPU"),
    Case("--gpu H200 (no price)", ["simulate", "--trace", TRACE, "--gpu", "H200"], "--gpu: unknown GPU 'H200'"),
    Case("--spot-gpus -1", ["simulate", "--trace", TRACE, "--spot-gpus", "-1"], "--spot-gpus: spot_gpus: expected an integer"),
    Case("--iterations 0", ["simulate", "--trace", TRACE, "--iterations", "0"], "--iterations: iterations: expected an integer"),
    Case("--policy bogus", ["simulate", "--trace", TRACE, "--policy", "ondemand,bogus"], "--policy: unknown policy 'bogus'"),
    Case("--plot into a missing folder", ["simulate", "--trace", TRACE, "--plot", "no/such/dir/p.png"],
         "--plot: no/such/dir is not an existing folder"),
    Case("--step-times binary", ["simulate", "--trace", TRACE, "--step-times", "s.yaml"], "s.yaml: a binary file",
         {"s.yaml": BINARY}),
    Case("--step-times alias bomb", ["simulate", "--trace", TRACE, "--step-times", "s.yaml"],
         "anchors and aliases are not accepted", {"s.yaml": _bomb().replace("seed", "heads")}),
    Case("--step-times empty", ["simulate", "--trace", TRACE, "--step-times", "s.yaml"], "empty step-time file",
         {"s.yaml": ""}),
    Case("--step-times heads 10**9", ["simulate", "--trace", TRACE, "--step-times", "s.yaml"],
         "step_times.heads: expected a number in [1, 1024]", {"s.yaml": "heads: 1000000000\n"}),
    Case("counts trace 10,300000000", ["simulate", "--trace", "t.csv"], "t.csv:2: count 300000000 is more than 65,536",
         {"t.csv": "t_s,nodes\n10,300000000\n"}),
    Case("synthetic trace of 10**8 nodes", ["simulate", "--trace", "synth:poisson?nodes=100000000"],
         "nodes: expected an integer in [1, 65,536]"),
    Case("missing trace", ["simulate", "--trace", "nope.csv"], "nope.csv: no such trace file"),
    Case("--trace a FIFO", ["simulate", "--trace", "t.csv"], "t.csv: a FIFO", {"t.csv": FIFO}),
    Case("--step-times a FIFO", ["simulate", "--trace", TRACE, "--step-times", "s.yaml"], "s.yaml: a FIFO",
         {"s.yaml": FIFO}),
    Case("--prices a FIFO", ["simulate", "--trace", TRACE, "--prices", "p.csv"], "--prices: p.csv: a FIFO",
         {"p.csv": FIFO}),
    Case("--plot of an unknown format", ["simulate", "--trace", TRACE, "--plot", "p.foo"],
         "--plot: p.foo: expected a file name ending in .png"),
    Case("--trace name with ESC", ["simulate", "--trace", "\x1b]0;pwned\x07t.csv"],
         "\\x1b]0;pwned\\x07t.csv: no such trace file"),
]

LAUNCH = [
    Case("binary config", ["launch", "c.yaml", "--dryrun"], "c.yaml: a binary file", {"c.yaml": BINARY}),
    Case("empty config", ["launch", "c.yaml", "--dryrun"], "empty config file", {"c.yaml": ""}),
    Case("duplicate keys", ["launch", "c.yaml", "--dryrun"], "duplicate key 'cloud'", {"c.yaml": FLEET + "cloud: {}\n"}),
    Case("alias bomb", ["launch", "c.yaml", "--dryrun"], "anchors and aliases", {"c.yaml": _bomb()}),
    Case("100k-deep JSON config", ["launch", "c.json", "--dryrun"], "nested deeper", {"c.json": DEEP_JSON_CONFIG}),
    Case("--out an existing file", ["launch", "c.yaml", "--dryrun", "--out", "taken"], "--out: taken is an existing file",
         {"c.yaml": FLEET, "taken": "x"}),
    Case("cloud.gpu: H900", ["launch", "c.yaml", "--dryrun"], "cloud.gpu: expected an accelerator SkyPilot knows",
         {"c.yaml": FLEET.replace("H100", "H900")}),
    Case("--name not a cluster name", ["launch", "c.yaml", "--dryrun", "--name", "Bad_Name"], "--name: expected lower-case",
         {"c.yaml": FLEET}),
    Case("checkpoint_uri file:///etc", ["launch", "c.yaml", "--dryrun"], "outside the allowed folders",
         {"c.yaml": FLEET + "  checkpoint_uri: file:///etc\n"}),
    Case("cloud.gpus_per_node 10**6", ["launch", "c.yaml", "--dryrun"], "cloud.gpus_per_node: expected at most 64",
         {"c.yaml": FLEET + "  gpus_per_node: 1000000\n"}),
    Case("config is a FIFO", ["launch", "c.yaml", "--dryrun"], "c.yaml: a FIFO", {"c.yaml": FIFO}),
    Case("newline in a config key", ["launch", "c.yaml", "--dryrun"], "cloud.a\\nb: unknown field",
         {"c.yaml": FLEET + '  "a\\nb": 1\n'}),
    # issue 27: what reaches a shell on every node is checked against its grammar (`cloud.names`)
    Case("image_id with ${IFS}", ["launch", "c.yaml", "--dryrun"], "cloud.image_id: expected docker:IMAGE",
         {"c.yaml": FLEET + "  image_id: docker:img;touch${IFS}/tmp/PWN\n"}),
    Case("image_id with $(...)", ["launch", "c.yaml", "--dryrun"], "cloud.image_id: expected docker:IMAGE",
         {"c.yaml": FLEET + '  image_id: "docker:img$(id)"\n'}),
    Case("an AMI on GCP", ["launch", "c.yaml", "--dryrun"], "cloud.image_id: expected docker:IMAGE",
         {"c.yaml": FLEET + "  provider: gcp\n  image_id: ami-0123456789abcdef0\n"}),
    Case("region with a command", ["launch", "c.yaml", "--dryrun"], "cloud.region: expected an AWS region",
         {"c.yaml": FLEET + "  region: us-east-1;id\n"}),
    Case("a GCP region on AWS", ["launch", "c.yaml", "--dryrun"], "cloud.region: expected an AWS region (e.g. us-east-1)",
         {"c.yaml": FLEET + "  provider: aws\n  region: us-central1\n"}),
    Case("--out with $(...)", ["launch", "c.yaml", "--dryrun", "--checkpoint-uri", "s3://fleet-bucket/r", "--out", "o$(id)"],
         "--out: expected a folder whose path has only", {"c.yaml": FLEET}),
]

TRACES = [
    Case("show binary", ["traces", "show", "t.csv"], "t.csv: a binary file", {"t.csv": BINARY}),
    Case("show counts 10,300000000", ["traces", "show", "t.csv"], "count 300000000 is more than 65,536 nodes",
         {"t.csv": "t_s,nodes\n10,300000000\n"}),
    Case("show GCP count 3e8", ["traces", "show", "t.txt"], "t.txt:1: count 300000000 is more than",
         {"t.txt": "2021-12-11, 11:11:30, 300000000\n"}),
    Case("show counts that add 65,537 nodes in all", ["traces", "show", "t.csv"], "t.csv:5: more than 65,536 distinct nodes",
         {"t.csv": "t_s,nodes\n" + "".join(f"{i},{65536 * (i % 2)}\n" for i in range(40))}),
    Case("show 100k-deep JSON", ["traces", "show", "t.json"], "nested too deeply", {"t.json": DEEP_JSON}),
    Case("show JSON with NaN", ["traces", "show", "t.json"], "NaN is not a JSON number",
         {"t.json": '{"metadata": {"gap_seconds": NaN}, "data": [0]}'}),
    Case("show JSON duplicate keys", ["traces", "show", "t.json"], "duplicate key 'data'",
         {"t.json": '{"metadata": {"gap_seconds": 60}, "data": [0], "data": [1]}'}),
    Case("show JSON of 10 years of ticks", ["traces", "show", "t.json"], "more than ten years",
         {"t.json": '{"metadata": {"gap_seconds": 1e8}, "data": [0, 1, 0, 1]}'}),
    Case("show nan time", ["traces", "show", "t.csv"], "t.csv:1: time nan ms is not a finite time", {"t.csv": "nan,add,n1\n"}),
    Case("show negative time", ["traces", "show", "t.csv"], "t.csv:2: time -5 ms", {"t.csv": "0,add,n1\n-5,remove,n1\n"}),
    Case("show a time beyond ten years", ["traces", "show", "t.csv"], "later than", {"t.csv": "1e300,add,n1\n"}),
    Case("show a long line", ["traces", "show", "t.csv"], "fields in", {"t.csv": "0," * 400_000 + "\n"}),
    Case("show a node name of 1000 characters", ["traces", "show", "t.csv"], "node name",
         {"t.csv": "0,add," + "n" * 1000 + "\n"}),
    Case("show a file over 8 MiB", ["traces", "show", "t.csv"], "larger than 8 MiB",
         {"t.csv": "0,add,n1\n" + "#" * (8 << 20)}),
    Case("show synth 10**8 nodes", ["traces", "show", "synth:poisson?nodes=100000000"], "nodes: expected an integer"),
    Case("synth too many events", ["traces", "synth", "synth:poisson?rate_h=100000&hours=1000", "--out", "o.csv"],
         "events expected"),
    Case("synth without --out", ["traces", "synth", "synth:poisson?hours=1"], "--out FILE is required"),
    # issue 42: flags that do not apply were accepted and ignored; one parser per subcommand now
    Case("show --out", ["traces", "show", TRACE, "--out", "o.csv"], "unrecognized arguments: --out o.csv"),
    Case("synth --plot", ["traces", "synth", "synth:poisson?hours=1", "--out", "o.csv", "--plot", "p.png"],
         "unrecognized arguments: --plot p.png"),
    Case("bench lora --world", ["bench", "lora", "--world", "2"], "unrecognized arguments: --world 2"),
    Case("bench throughput --executors", ["bench", "throughput", "--executors", "1"],
         "unrecognized arguments: --executors 1"),
    Case("simulate --config --plot", ["simulate", "--config", "c.yaml", "--trace", TRACE, "--plot", "p.png"],
         "simulate --config: --plot does not apply (the run config sets the fleet", {"c.yaml": "seed: 1\n"}),
    Case("simulate --config --gpus", ["simulate", "--config", "c.yaml", "--trace", TRACE, "--gpus", "8"],
         "simulate --config: --gpus does not apply", {"c.yaml": "seed: 1\n"}),
    Case("synth --out a folder", ["traces", "synth", "synth:poisson?hours=1", "--out", "d/"], "--out: d is a folder",
         {"d/": ""}),
    # issue 41: refused only after the trace was made; /proc refuses a new file even to root
    Case("synth --out on /proc", ["traces", "synth", "synth:poisson?hours=1", "--out", "/proc/spotlight-t.csv"],
         "--out: /proc/spotlight-t.csv cannot be written"),
    Case("synth with a repeated field", ["traces", "show", "synth:poisson?nodes=2&nodes=3"], "nodes is given twice"),
    Case("show a FIFO", ["traces", "show", "t.csv"], "t.csv: a FIFO", {"t.csv": FIFO}),
    Case("show --plot of an unknown format", ["traces", "show", TRACE, "--plot", "p.foo"],
         "--plot: p.foo: expected a file name ending in .png"),
    Case("show a trace whose name has a newline", ["traces", "show", "t\n.csv"], "t\\n.csv:1:", {"t\n.csv": "x\n"}),
]

PRICES = [
    Case("--gpu H900", ["prices", "--gpu", "H900"], "unknown GPU 'H900'"),
    Case("--table binary", ["prices", "--table", "p.csv"], "p.csv: not a UTF-8 text file", {"p.csv": BINARY}),
    Case("--table with a 200 KB field", ["prices", "--table", "p.csv"], "p.csv: line 1: not a CSV table",
         {"p.csv": "provider," + "x" * 200_000 + "\n"}),
    Case("--table missing", ["prices", "--table", "nope.csv"], "nope.csv: cannot read price table"),
    Case("--table empty", ["prices", "--table", "p.csv"], "missing column", {"p.csv": ""}),
    Case("--table with an inf price", ["prices", "--table", "p.csv"], "ondemand_usd_h: expected dollars per hour",
         {"p.csv": "provider,instance_type,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date\n"
                   "aws,x1,H100,1,inf,1.0,test,2025-01-01\n"}),
    Case("--table with 10**9 GPUs a row", ["prices", "--table", "p.csv"], "gpus: expected a positive integer (at most 64)",
         {"p.csv": "provider,instance_type,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date\n"
                   "aws,x1,H100,1000000000,1.0,1.0,test,2025-01-01\n"}),
    Case("--write into a folder", ["prices", "--write", "d/"], "--write: d is a folder", {"d/": ""}),
    Case("--write on /proc", ["prices", "--write", "/proc/spotlight-p.csv"], "--write: /proc/spotlight-p.csv cannot be "
         "written"),
    Case("--refresh bogus", ["prices", "--refresh", "bogus"], "argument --refresh: invalid choice"),
    Case("--table a FIFO", ["prices", "--table", "p.csv"], "p.csv: a FIFO (named pipe), not a regular file",
         {"p.csv": FIFO}),
    Case("--table /dev/zero", ["prices", "--table", "/dev/zero"], "/dev/zero: a character device"),
    Case("--gpu with ESC", ["prices", "--gpu", "\x1b[2JH100"], "unknown GPU"),
]

BENCH = [
    Case("--repeats 0", ["bench", "throughput", "--repeats", "0"], "argument --repeats: expected an integer in [1, 1000]"),
    Case("--repeats -3", ["bench", "sp-regroup", "--repeats", "-3"], "argument --repeats: expected an integer in [1, 1000]"),
    Case("--world 10**6", ["bench", "sp-regroup", "--world", "1000000"], "argument --world: expected an integer in [2, 16]"),
    Case("--heads 0", ["bench", "sp-regroup", "--heads", "0"], "argument --heads: expected an integer in [1, 64]"),
    Case("--iterations nan", ["bench", "scheduler", "--iterations", "nan"], "argument --iterations: expected an integer"),
    Case("--world that does not divide --heads", ["bench", "sp-regroup", "--world", "3", "--heads", "4"],
         "--world 3 must divide --heads 4"),
    Case("unknown bench", ["bench", "bogus"], "argument NAME: invalid choice: 'bogus'"),
    Case("unknown flag with ESC and a newline", ["bench", "throughput", "--\x1b[2J\nspotlight: error: forged"],
         "unrecognized arguments: --\\x1b[2J\\nspotlight: error: forged"),
]

# issue 41: results come home only into a place pull has checked, from a store it can name
PULL = [
    Case("--out a symlink", ["pull", "s3://bucket/run", "--out", "link"], "--out: link is a symbolic link",
         {"link": SYMLINK}),
    Case("an unknown scheme", ["pull", "ftp://host/run", "--out", "o"], "ftp://host/run: unknown scheme 'ftp'"),
    Case("a folder store outside the allowed folders", ["pull", "file:///etc", "--out", "o"],
         "file:///etc: a folder store outside the allowed folders"),
    Case("a bucket name S3 refuses", ["pull", "s3://b/run", "--out", "o"], "'b' is not a valid S3 bucket name"),
]

CASES = [(f"{group}: {c.id}", c) for group, cases in (("train", TRAIN), ("simulate", SIMULATE), ("launch", LAUNCH),
                                                      ("traces", TRACES), ("prices", PRICES), ("bench", BENCH),
                                                      ("pull", PULL))
         for c in cases]


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


_CLI = PEAK_REPORTING_CLI  # reports its peak memory as it exits (tests/cli_peak.py)


def _run(argv: list[str], cwd: Path, peak_file: Path) -> tuple[int, str, str, float, float]:
    """(exit code, stdout, stderr, seconds, peak MB) of the CLI run in `cwd`."""
    env = {k: v for k, v in os.environ.items() if k != "SPOTLIGHT_STORE_ROOTS"}
    env.update(CI="true", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _CLI, str(peak_file), *argv], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=limit)
    killer = threading.Timer(6 * LIMIT_S, proc.kill)  # a hung case fails on time, not by hanging the suite
    killer.start()
    try:
        stdout, stderr = proc.communicate()
    finally:
        killer.cancel()
    seconds = time.monotonic() - start
    peak_kb = float(peak_file.read_text()) if peak_file.is_file() else float("inf")
    return proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"), seconds, peak_kb / 1024


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path):
    if case.id == "--device cuda without CUDA":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name, content in case.files.items():
        if name.endswith("/"):
            (cwd / name).mkdir()
        elif content is FIFO:
            os.mkfifo(cwd / name)
        elif content is SYMLINK:
            (cwd / name).symlink_to(tmp_path / "elsewhere")
        elif isinstance(content, bytes):
            (cwd / name).write_bytes(content)
        else:
            (cwd / name).write_text(content)
    before = _tree(cwd)
    code, stdout, stderr, seconds, peak_mb = _run(case.argv, cwd, tmp_path / "peak-kb")
    lines = stderr.splitlines()
    assert code == 2, (code, stderr[-2000:])
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    assert len(lines) == 1 and lines[0].strip(), stderr[-2000:]
    (line,) = lines
    assert line.startswith("spotlight: error: ") and len(line) <= 300, line
    assert not [c for c in line if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")], ascii(line)
    assert case.expect in line, line
    assert _tree(cwd) == before, sorted(_tree(cwd) - before)
    assert seconds < LIMIT_S, f"{seconds:.1f} s"
    assert peak_mb < LIMIT_MB, f"{peak_mb:.0f} MB"


def test_the_table_covers_every_command_with_enough_cases():
    per_command: dict[str, int] = {}
    for _, case in CASES:
        per_command[case.argv[0]] = per_command.get(case.argv[0], 0) + 1
    assert set(per_command) == {"train", "simulate", "launch", "traces", "prices", "bench", "pull"}
    assert min(per_command.values()) >= 4 and len(CASES) >= 40, per_command
