"""The README and the pages of docs/ are executable documentation: their fenced ```python and ```bash blocks run as a
user pastes them, top to bottom, one document after the other (`DOCUMENTS`: the README, then the pages in the order a
reader follows them, then any other page of docs/), in a scratch copy of the repository, so they cannot rot. A page
continues from the ones before it (the docs' blocks translate with the models the README's tour trains).

Blocks that are not run: a fence without a language (or `text`, `json`, `markdown`, `yaml`) is a listing; a
```python or ```bash block that cannot run offline or takes minutes is marked on the line before its fence with
`<!-- not run: REASON -->` (an HTML comment: invisible on GitHub, PyPI and the site), the reason required.

How the blocks run:
- The scratch copy is a directory whose entries are symlinks to this checkout's files (no `runs/`, no `.git`), next
  to a symlink `shared` -> `../shared`, so `../shared/data/multi30k` is the real Multi30k and every `runs/...` the
  blocks write stays in the scratch directory. The package comes from this checkout (`PYTHONPATH`).
- A bash block runs command by command (lines joined at a trailing `\\`, comment lines skipped) with `bash`; a
  python block runs as a script with `python`. A python block that does not import `hf_layerfusion` runs where the
  package cannot be imported (`python -S`, site-packages without their `.pth` files): what the README says runs
  without the package must.
- The Hub: blocks that name Hub repositories talk to `tests/hub_server.py` on 127.0.0.1 (`HF_ENDPOINT`, a token in
  `HF_TOKEN`, an empty `HF_HOME`), the Hub of this machine being unreachable. The server holds stand-ins for the
  two public repositories the README converts, both random and tiny but with the real layer counts:
  `Helsinki-NLP/opus-mt-en-de` (a `MarianMTModel`, 6 + 6 layers, d_model 16) and `FacebookAI/xlm-roberta-base` (12
  layers, hidden size 16, with an XLM-R tokenizer trained on Multi30k); `you/gtrans-en-de` is what the README's own
  publishing block pushes.

What is substituted, each for the time it would take (the README's sizes are minutes to hours on a CPU), and nothing
else (every substitution must match exactly once, so a README edit that removes its target fails here):
- `PYTHON_SUBSTITUTIONS`: text replaced in a python block.
- `APPENDED_ARGUMENTS`: arguments appended to the shell command that contains the key (before a trailing comment);
  argparse keeps the last value of a repeated option, so they override the README's values.
- `SETUP_COMMANDS`: the two set-up commands are checked verbatim and not run here: the first installs packages and
  runs the 3-minute main job (its step in a process without the package is tested below), the second is this test
  suite itself (`.ci/run` runs it).
- `EXPECTED_REFUSALS`: commands that must stop with a clear message on this machine (a multi-GPU launch without GPUs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import require_shared, tiny_model, tiny_tokenizer, without_package_preamble
from huggingface_hub import HfApi
from hub_server import HubServer
from transformers import MarianConfig, MarianMTModel

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
# the order a reader follows; a page of docs/ not named here runs after these, in name order
DOCUMENT_ORDER = (
    "getting_started", "training", "translation", "hub", "plain_transformer", "gtrans", "layerwise_coordination",
    "rtal", "re_transformer", "deep_representations", "design", "design_fast_cpu", "adding_a_family", "contributing",
    "testing",
)
LISTING_LANGUAGES = {"", "text", "json", "markdown", "yaml"}
# (python, python without the package, bash) steps of all the documents together
COUNTS = (12, 1, 8)
SHARED = REPO_ROOT.parent / "shared"
MULTI30K = SHARED / "data" / "multi30k"
sys.path.insert(0, str(REPO_ROOT / "examples"))
from run_multilingual import ModelArguments, build_tiny_random_xlmr  # noqa: E402

SETUP_COMMANDS = (
    'pip install torch==2.13.0 && pip install -e ".[train]" && python examples/quickstart.py',
    'pip install torch==2.13.0 && pip install -e ".[test]" -c tests/constraints.txt && python -m pytest -q',
)

# the multi30k preset's 6 + 6 layers and 4 heads at d_model 32: seconds instead of 35 minutes
TINY_TRAINING = (
    "--max_train_samples 256 --max_eval_samples 8 --max_predict_samples 8 --tokenizer_vocab_size 400 "
    "--max_new_tokens 8 --per_device_train_batch_size 16"
)
TINY_MODEL = "d_model=32,encoder_ffn_dim=64,decoder_ffn_dim=64"


@dataclass(frozen=True)
class Substitution:
    old: str
    new: str
    why: str


PYTHON_SUBSTITUTIONS = [
    Substitution(
        'GTransConfig.from_preset("opus100")',
        'GTransConfig.from_preset("opus100", vocab_size=1000, d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, '
        "encoder_attention_heads=2, decoder_attention_heads=2)",
        "335M parameters take ~30 s and 3.3 GB to build; the layer counts and group sizes stay",
    ),
]

APPENDED_ARGUMENTS = {
    "--output_dir runs/plain ": (
        f"--max_train_minutes 0.002 {TINY_TRAINING} --config_overrides {TINY_MODEL}",
        "a budget of 0.12 s, so that the time budget (not the step count) ends training, as in the README",
    ),
    "--output_dir runs/m30k-gtrans ": (
        f"--max_steps 10 --save_steps 2 {TINY_TRAINING} "
        f"--config_overrides encoder_group_size=3,decoder_group_size=2,{TINY_MODEL}",
        "10 steps, a checkpoint every 2: the 5 checkpoints the averaging command reads",
    ),
    "--output_dir runs/m30k-gtrans-ddp ": (
        f"--max_steps 2 {TINY_TRAINING} --config_overrides {TINY_MODEL}",
        "refused before training on a machine without 2 GPUs; tiny where it runs",
    ),
    "--output_dir runs/m30k-gtrans-cpu-ddp ": (
        f"--max_steps 2 {TINY_TRAINING} --config_overrides {TINY_MODEL}",
        "2 DDP steps of 2 CPU processes",
    ),
    "--output_dir runs/m30k-multilingual ": (
        "--max_steps 2 --standin_train_size 64 --tiny_vocab_size 300 --max_eval_samples 2 --max_new_tokens 4 "
        "--tiny_xlmr_config hidden_size=16,num_hidden_layers=2,num_attention_heads=2,intermediate_size=32",
        "2 steps of a 2-layer XLM-R on 126 pairs instead of 300 steps on 7,875",
    ),
}

GPUS = torch.cuda.device_count()
EXPECTED_REFUSALS = {
    # key: (message the command must show, whether it applies on this machine)
    "accelerate launch --config_file examples/accelerate_multigpu.yaml": (
        r"Launched as 2 processes on this machine .* but \d GPU\(s\) are visible.*--use_cpu True",
        GPUS < 2,
    ),
}


# ---------------------------------------------------------------------------------------------------- parsing
def documents() -> list[Path]:
    """The README, then every page of docs/: those of `DOCUMENT_ORDER` in that order, the others by name."""
    pages = sorted(DOCS.glob("*.md"))
    ordered = [DOCS / f"{name}.md" for name in DOCUMENT_ORDER if (DOCS / f"{name}.md").is_file()]
    return [README, *ordered, *[page for page in pages if page not in ordered]]


def documents_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in documents())


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """`(language, code)` of every fenced block, in order."""
    return [(language, code) for _, language, code in marked_blocks(text)]


def marked_blocks(text: str) -> list[tuple[str | None, str, str]]:
    """`(reason, language, code)` of every fenced block, in order; `reason` is None unless the line before the fence
    is `<!-- not run: REASON -->`."""
    blocks = re.findall(
        r"^(<!-- not run:(.*?)-->\n)?```(\w*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL
    )
    return [(reason.strip() if marker else None, language, code) for marker, reason, language, code in blocks]


def shell_commands(block: str) -> list[str]:
    """The commands of a bash block: lines joined at a trailing backslash, blank and comment lines dropped."""
    commands, current = [], []
    for line in block.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if not line.rstrip().endswith("\\"):
            commands.append("\n".join(current))
            current = []
    assert not current, f"a command ends with a backslash: {current}"
    return commands


def append_arguments(command: str, arguments: str) -> str:
    """`command` with `arguments` appended to its last line, before a trailing comment."""
    *head, last = command.split("\n")
    code, hash_, comment = last.partition("  #")
    return "\n".join([*head, f"{code.rstrip()} {arguments}" + (f"  {hash_.strip()}{comment}" if hash_ else "")])


def readme_steps(text: str) -> list[tuple[str, str]]:
    """`("python" | "python-without-package" | "bash", code)` for every step to run, substitutions applied."""
    for substitution in PYTHON_SUBSTITUTIONS:
        assert text.count(substitution.old) == 1, f"substitution target not exactly once in the documents: {substitution.old}"
        text = text.replace(substitution.old, substitution.new)
    steps, keys_used = [], {key: 0 for key in APPENDED_ARGUMENTS}
    for reason, language, code in marked_blocks(text):
        if reason is not None:
            assert reason, f"a block marked not to run without its reason:\n{code}"
            assert language in {"python", "bash"}, f"only python and bash blocks run; a ```{language} block is not marked"
            continue
        if language == "python":
            imports_package = re.search(r"^\s*(import|from)\s+hf_layerfusion\b", code, flags=re.MULTILINE)
            steps.append(("python" if imports_package else "python-without-package", code))
        elif language == "bash":
            if code.strip() in SETUP_COMMANDS:
                continue
            for command in shell_commands(code):
                for key, (arguments, _) in APPENDED_ARGUMENTS.items():
                    if key in command + " ":
                        keys_used[key] += 1
                        command = append_arguments(command, arguments)
                steps.append(("bash", command))
        else:
            assert language in LISTING_LANGUAGES, f"a ```{language} block: run it here, or make it a listing (```)"
    assert all(count == 1 for count in keys_used.values()), f"APPENDED_ARGUMENTS keys not matched once: {keys_used}"
    return steps


def test_readme_parsing_sees_every_block():
    text = README.read_text(encoding="utf-8")
    bash_blocks = [code.strip() for language, code in fenced_blocks(text) if language == "bash"]
    # the set-up commands are the README's first two bash blocks, verbatim
    assert tuple(bash_blocks[:2]) == SETUP_COMMANDS
    # the README's first block is code a user runs offline in seconds (a tiny model of every family)
    first_language, first_code = fenced_blocks(text)[0]
    assert first_language == "python" and "FAMILIES" in first_code and "generate(" in first_code
    # every page of docs/ is read, after the README
    assert documents()[0] == README and set(documents()[1:]) == set(DOCS.glob("*.md"))
    steps = readme_steps(documents_text())
    kinds = [kind for kind, _ in steps]
    assert (kinds.count("python"), kinds.count("python-without-package"), kinds.count("bash")) == COUNTS, kinds
    assert append_arguments("a \\\n  b  # note", "--x 1") == "a \\\n  b --x 1  # note"


def test_blocks_marked_not_to_run_say_why():
    marked = [(reason, language) for reason, language, _ in marked_blocks(documents_text()) if reason is not None]
    assert marked, "no block is marked <!-- not run: ... --> (the parser would not see the marker)"
    assert all(reason and language in {"python", "bash"} for reason, language in marked), marked
    assert marked_blocks("<!-- not run: slow -->\n```bash\nx\n```\n```python\ny\n```\n") == [
        ("slow", "bash", "x\n"), (None, "python", "y\n")
    ]


# ---------------------------------------------------------------------------------------------------- running
@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The local Hub with tiny stand-ins of the repositories the README converts (see the module docstring)."""
    require_shared(MULTI30K / "train.en", "Multi30k data (the README's commands train on it)")
    server = HubServer().start()
    root = tmp_path_factory.mktemp("hub_repos")
    api = HfApi(endpoint=server.endpoint, token="hf_readme_test")

    marian_dir = root / "marian"
    MarianMTModel(
        MarianConfig(
            vocab_size=64, decoder_vocab_size=64, d_model=16, encoder_layers=6, decoder_layers=6,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            max_position_embeddings=64, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
        )
    ).save_pretrained(marian_dir)
    xlmr_dir = root / "xlmr"
    texts = [line for lang in ("en", "de") for line in (MULTI30K / f"train.{lang}").read_text().split("\n")[:500]]
    tiny = ModelArguments(
        tiny_xlmr_config="hidden_size=16,num_hidden_layers=12,num_attention_heads=2,intermediate_size=32",
        tiny_vocab_size=400,
    )
    build_tiny_random_xlmr(str(xlmr_dir), texts, tiny)
    for repo_id, directory in (("Helsinki-NLP/opus-mt-en-de", marian_dir), ("FacebookAI/xlm-roberta-base", xlmr_dir)):
        api.create_repo(repo_id)
        api.upload_folder(repo_id=repo_id, folder_path=directory)
    yield server
    server.stop()


def scratch_copy(root: Path) -> Path:
    """`root/repo`: symlinks to this checkout's entries (no runs/, no .git), and `root/shared` -> ../shared."""
    repo = root / "repo"
    repo.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in {".git", "runs"}:
            (repo / entry.name).symlink_to(entry)
    (root / "shared").symlink_to(SHARED)
    return repo


def run_step(kind: str, code: str, repo: Path, env: dict, script: Path) -> subprocess.CompletedProcess:
    if kind == "bash":
        command = ["bash", "-o", "pipefail", "-c", code]
    else:
        # the python-without-package steps cannot import hf_layerfusion (checked)
        preamble = without_package_preamble() if kind == "python-without-package" else ""
        script.write_text(preamble + code, encoding="utf-8")
        command = [sys.executable, *(["-S"] if kind == "python-without-package" else []), str(script)]
        if kind == "python-without-package":
            env = {key: value for key, value in env.items() if key != "PYTHONPATH"}
    # no terminal: a prompt such as transformers' "Do you wish to run the custom code? [y/N]" shows in the output
    # instead of waiting for an answer
    return subprocess.run(
        command, cwd=repo, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )


def test_readme_runs_as_pasted(hub, tmp_path):
    repo = scratch_copy(tmp_path)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",  # `python`, `accelerate`: this interpreter's
        PYTHONPATH=str(REPO_ROOT),  # this checkout's package, whatever an editable install points at
        HF_ENDPOINT=hub.endpoint,
        HF_TOKEN="hf_readme_test",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        OMP_NUM_THREADS="1",
        OMP_WAIT_POLICY="PASSIVE",
        TOKENIZERS_PARALLELISM="false",
    )
    outputs = {}
    for index, (kind, code) in enumerate(readme_steps(documents_text())):
        result = run_step(kind, code, repo, env, tmp_path / f"block_{index}.py")
        output = result.stdout + result.stderr
        refusal = next((value for key, value in EXPECTED_REFUSALS.items() if key in code), None)
        if refusal is not None and refusal[1]:
            assert result.returncode != 0 and re.search(refusal[0], output, flags=re.DOTALL), output[-5000:]
        else:
            assert result.returncode == 0, f"README step {index} ({kind}) failed:\n{code}\n---\n{output[-6000:]}"
            assert "Traceback" not in output, f"README step {index} printed a traceback:\n{code}\n---\n{output[-6000:]}"
        outputs[code] = output

    def output_of(fragment: str) -> str:
        (output,) = [output for code, output in outputs.items() if fragment in code]
        return output

    runs = repo / "runs"
    # the runs/plain command: the time budget ended training, and the run says so
    assert "The time budget ended training" in output_of("--output_dir runs/plain ")
    assert json.loads((runs / "plain" / "train_results.json").read_text())["time_budget_ended_training"] is True
    # the training command: BLEU of both splits, the 5 checkpoints the averaging command reads
    assert {"validation", "test"} <= set(json.loads((runs / "m30k-gtrans" / "bleu_results.json").read_text()))
    averaging = output_of("hf_layerfusion.checkpoint_averaging")
    assert "Averaged checkpoint-2, checkpoint-4, checkpoint-6, checkpoint-8, checkpoint-10" in averaging
    assert "RuntimeWarning" not in averaging
    assert len((runs / "test_2016_flickr.de").read_text(encoding="utf-8").split("\n")) == 1001  # 1000 lines
    # a multi-GPU launch without the GPUs wrote nothing; the CPU one trained one model in one run
    if GPUS < 2:
        assert not (runs / "m30k-gtrans-ddp").exists()
    assert (runs / "m30k-gtrans-cpu-ddp" / "model.safetensors").is_file()
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in output_of("--output_dir runs/m30k-gtrans-cpu-ddp ")
    assert len(json.loads((runs / "m30k-multilingual" / "direction_scores.json").read_text())["scores"]) == 12
    # published through the Hub client; loaded without the package, with no interactive prompt and no warning
    assert "you/gtrans-en-de" in hub.httpd.repos
    loading = output_of('repo = "you/gtrans-en-de"')
    assert "Do you wish to run the custom code" not in loading and "model of type ``" not in loading
    # no "Both `max_new_tokens` and `max_length` seem to have been set" from the pipeline
    assert "seem to have been set" not in output_of('pipeline("layerfusion-translation"')

    # the model card the publishing block wrote: its snippets run too (with the package, and without it)
    card = (runs / "gtrans-en-de" / "README.md").read_text(encoding="utf-8")
    card_blocks = [code for language, code in fenced_blocks(card) if language == "python"]
    assert len(card_blocks) == 2
    for index, code in enumerate(card_blocks):
        kind = "python" if "hf_layerfusion" in code else "python-without-package"
        result = run_step(kind, code, repo, env, tmp_path / f"card_block_{index}.py")
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "Traceback" not in output, f"model card block {index}:\n{output[-6000:]}"
        assert "Do you wish to run the custom code" not in output and "seem to have been set" not in output, output


def test_main_jobs_check_without_the_package_ignores_pythonpath(tmp_path, monkeypatch):
    """The first set-up command is not run here (see the module docstring); its last step, translating in a process
    that cannot import hf_layerfusion, must hold with `PYTHONPATH` pointing at a checkout (it said "hf_layerfusion is
    importable" and failed)."""
    import quickstart

    model, tokenizer = tiny_model("gtrans"), tiny_tokenizer()
    model.save_pretrained(tmp_path / "gtrans")
    tokenizer.save_pretrained(tmp_path / "gtrans")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    translations = quickstart.translate_without_package(tmp_path / "gtrans", ["ab ba", "b"])
    assert len(translations) == 2 and all(isinstance(text, str) for text in translations)
