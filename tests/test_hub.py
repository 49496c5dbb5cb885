"""Hub sharing without the package, driven through the real huggingface_hub client over HTTP.

`tests/hub_server.py` (standard library) serves a Hub-compatible API on 127.0.0.1. For every family in
`hf_layerfusion.FAMILIES`, this test saves two versions of a tiny model (random weights, fusion weights moved off
their initial 0), a tokenizer and a rendered model card; a *publisher* process (package installed, `HF_ENDPOINT`
pointing at the server) pushes them as two commits; a *consumer* process whose `sys.path` has no entry that can
import hf_layerfusion (asserted) downloads each revision into an empty `HF_HOME`, loads it with
`trust_remote_code=True` and computes logits, beam-4 output (and, for families with several decoder groups,
`decoder_groups` output) and the `"translation"` pipeline's translations. They must equal what the package computes
here from the same saved weights: logits bit for bit, token ids and texts exactly.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from helpers import (
    GENERATION,
    REPO_ROOT,
    SOURCES,
    TINY_BACKBONE,
    run_python,
    tiny_model,
    tiny_tokenizer,
    without_package_preamble,
)
from hub_server import HubServer
from packaging.requirements import Requirement
from transformers import AutoModelForSeq2SeqLM

import hf_layerfusion
from hf_layerfusion.hub.remote_code import (
    REMOTE_CODE_FILE,
    RemoteCodeError,
    _Flattener,
    check_model_directory,
    generate_remote_code,
)

FAMILIES = sorted(hf_layerfusion.FAMILIES)
USER = "test-user"


def model_outputs(model, tokenizer, transformers_pipeline, task: str) -> dict:
    """What both processes compute: logits on a padded batch, beam-4 ids, per-group ids, pipeline translations."""
    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    decoder_input_ids = torch.tensor([[2, 5, 6, 7, 8], [2, 9, 10, 4, 11], [2, 12, 13, 14, 5], [2, 6, 6, 7, 15]])
    with torch.no_grad():
        outputs = {
            "logits": model(**batch, decoder_input_ids=decoder_input_ids).logits,
            "beam": model.generate(**batch, **GENERATION),
        }
        groups = model.config.num_decoder_groups
        if groups > 1:
            outputs["logits_top_group"] = model(
                **batch, decoder_input_ids=decoder_input_ids, decoder_groups=[groups]
            ).logits
            outputs["beam_top_group"] = model.generate(**batch, decoder_groups=[groups], **GENERATION)
    if transformers_pipeline is not None:
        translator = transformers_pipeline(task, model=model, tokenizer=tokenizer)
        outputs["pipeline"] = [r["translation_text"] for r in translator(SOURCES, batch_size=3, **GENERATION)]
        outputs["pipeline_int8"] = [r["translation_text"] for r in translator(SOURCES, batch_size=3, quantization="int8",
                                                                              **GENERATION)]
    return outputs


# The consumer: no hf_layerfusion on sys.path (`helpers.without_package_preamble`), a fresh HF_HOME, everything through
# the Hub client.
CONSUMER = textwrap.dedent(
    """
    import json, os
    import torch
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
    torch.set_num_threads(1)
    exec(open({helpers!r}).read())  # model_outputs() etc. from the test file, package-free
    plan = json.load(open({plan!r}))
    results = {{"outputs": {{}}, "errors": {{}}}}
    def hub_pipeline(task, model, tokenizer):  # the pipeline class, model and tokenizer all come from the Hub
        return pipeline(task, model=repo_id, revision=revision, trust_remote_code=True)

    for repo_id, revisions in plan["repos"].items():
        results["main_sha"] = {{**results.get("main_sha", {{}}), repo_id: HfApi().model_info(repo_id).sha}}
        for label, revision in revisions.items():
            model = AutoModelForSeq2SeqLM.from_pretrained(repo_id, revision=revision, trust_remote_code=True)
            # as the model card says: without the flag the tokenizer stops at an interactive prompt
            tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision, trust_remote_code=True)
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            # the pipeline (one more model load) once per repository: the first revision listed
            with_pipeline = label == next(iter(revisions))
            results["outputs"][repo_id + "@" + label] = model_outputs(
                model, tokenizer, hub_pipeline if with_pipeline else None, "translation"
            )
    repo_id = next(iter(plan["repos"]))
    model = AutoModelForSeq2SeqLM.from_pretrained(repo_id, trust_remote_code=True)
    model.save_pretrained(plan["resave_dir"])  # transformers copies the Hub code along (its `_auto_class`)
    for name, call in {{
        "missing_repo": lambda: hf_hub_download("test-user/no-such-model", "config.json"),
        "missing_revision": lambda: hf_hub_download(repo_id, "config.json", revision="no-such-branch"),
        "missing_file": lambda: hf_hub_download(repo_id, "no_such_file.json"),
        "no_trust_remote_code": lambda: AutoModelForSeq2SeqLM.from_pretrained(repo_id, trust_remote_code=False),
    }}.items():
        try:
            call()
            results["errors"][name] = None
        except Exception as error:
            results["errors"][name] = (type(error).__name__, str(error))
    results["hf_home_files"] = sorted(str(p.relative_to(os.environ["HF_HOME"])) for p in
                                      __import__("pathlib").Path(os.environ["HF_HOME"]).rglob("*") if p.is_file())
    torch.save(results, plan["output"])
    """
)

PUBLISHER = textwrap.dedent(
    """
    import json, sys
    import hf_layerfusion
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    plan = json.load(open(sys.argv[1]))
    shas = {}
    for repo_id, directories in plan["pushes"].items():
        shas[repo_id] = {label: hf_layerfusion.push_to_hub(path, repo_id).oid for label, path in directories.items()}
    # transformers' own push_to_hub writes the Hub code too (through save_pretrained)
    repo_id, directory = plan["transformers_push"]
    AutoModelForSeq2SeqLM.from_pretrained(directory).push_to_hub(repo_id)
    AutoTokenizer.from_pretrained(directory).push_to_hub(repo_id)
    print(json.dumps(shas))
    """
)


def helpers_source() -> str:
    """The package-free definitions the consumer process needs: `model_outputs` of this file, the inputs of
    tests/helpers.py."""
    nodes = []
    for path, wanted in ((Path(__file__).with_name("helpers.py"), {"SOURCES", "GENERATION"}),
                         (Path(__file__), {"model_outputs"})):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes += [n for n in tree.body if getattr(n, "name", None) in wanted or (
            isinstance(n, ast.Assign) and {t.id for t in n.targets if isinstance(t, ast.Name)} & wanted)]
    return "\n\n".join(ast.unparse(n) for n in nodes)


@pytest.fixture(scope="module")
def hub():
    server = HubServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def published(hub, tmp_path_factory):
    """Save two versions per family, push them through the client, download and run them without the package."""
    root = tmp_path_factory.mktemp("hub")
    tokenizer = tiny_tokenizer()
    assert len(tokenizer) <= TINY_BACKBONE["vocab_size"]
    pushes, references = {}, {}
    for model_type in FAMILIES:
        repo_id = f"{USER}/tiny-{model_type.replace('_', '-')}"
        pushes[repo_id] = {}
        for label, seed in (("v1", 0), ("v2", 1)):
            directory = root / "local" / model_type / label
            model = tiny_model(model_type, seed)
            model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
            hf_layerfusion.write_model_card(directory, model, "de", "en", "tiny", repo_id=repo_id)
            pushes[repo_id][label] = str(directory)
            from transformers import pipeline

            references[(repo_id, label)] = model_outputs(model, tokenizer, pipeline, "layerfusion-translation")
    transformers_repo = f"{USER}/pushed-by-transformers"
    plan = {"pushes": pushes, "transformers_push": [transformers_repo, pushes[f"{USER}/tiny-gtrans"]["v1"]]}
    (root / "publish.json").write_text(json.dumps(plan))
    hub_env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test_token"}
    # the publisher has this checkout's package (whatever is installed), the consumer none
    publisher_env = {**hub_env, "HF_HOME": str(root / "publisher"), "PYTHONPATH": str(REPO_ROOT)}
    published = run_python(["-c", PUBLISHER, str(root / "publish.json")], publisher_env, root)
    shas = json.loads(published.stdout.strip().splitlines()[-1])

    consumer_home = root / "consumer_home"
    consumer_home.mkdir()
    helpers = root / "helpers.py"
    helpers.write_text(helpers_source())
    repos = dict(shas)
    repos[transformers_repo] = {"main": "main"}
    consumer_plan = {"repos": repos, "output": str(root / "consumer.pt"), "resave_dir": str(root / "resaved")}
    (root / "consume.json").write_text(json.dumps(consumer_plan))
    script = without_package_preamble() + CONSUMER.format(helpers=str(helpers), plan=str(root / "consume.json"))
    run_python(["-S", "-c", script], {**hub_env, "HF_HOME": str(consumer_home)}, root)
    return {
        "references": references,
        "remote": torch.load(root / "consumer.pt", weights_only=False),
        "shas": shas,
        "root": root,
        "transformers_repo": transformers_repo,
        "hub": hub,
    }


# ------------------------------------------------------------------------------------------------ generator
def test_generated_code_is_self_contained_and_defines_every_family():
    code = generate_remote_code()
    tree = ast.parse(code)
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    # torch and what transformers itself requires (its metadata: an independent list), as import names
    transformers_requirements = {
        Requirement(line).name.replace("-", "_") for line in importlib.metadata.requires("transformers") if "extra" not in line
    }
    assert imported <= {"__future__", "torch", "transformers", *transformers_requirements} | set(sys.stdlib_module_names), imported
    defined = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    expected = {cls.__name__ for classes in hf_layerfusion.FAMILIES.values() for cls in classes}
    assert expected | {"LayerFusionTranslationPipeline"} <= defined
    # import it as a module of its own (dataclasses look string annotations up in the module): class bodies run
    module = types.ModuleType("generated_modeling_layerfusion")
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, REMOTE_CODE_FILE, "exec"), module.__dict__)
        assert module.GTransConfig().model_type == "gtrans"
    finally:
        del sys.modules[module.__name__]


@pytest.mark.parametrize(
    ("module", "name", "reason"),
    [
        ("hf_layerfusion.training.multilingual", "load_opus100", "comes from `datasets`"),
        ("hf_layerfusion.modeling.model", "no_such_name", "has no top-level `no_such_name`"),
    ],
)
def test_generator_refuses_what_it_cannot_inline(module, name, reason):
    with pytest.raises(RemoteCodeError, match=reason):
        _Flattener().require(module, name, "test")


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("def f():\n    from .other import g\n    return g\n", "module.py:2: a package import inside a function"),
        ("from . import other\n\n\ndef f():\n    return other\n", "imports a package module as an object"),
        ("print('side effect')\n\n\ndef f():\n    pass\n", "top-level Expr statement"),
    ],
)
def test_generator_refuses_package_code_it_cannot_inline(source, reason, tmp_path):
    """What no module of the package does (any longer), in a package written here."""
    package = tmp_path / "hf_layerfusion"
    package.mkdir()
    (package / "module.py").write_text(source)
    (package / "other.py").write_text("def g():\n    pass\n")
    with pytest.raises(RemoteCodeError, match=reason):
        _Flattener(package).require("hf_layerfusion.module", "f", "test")


# ------------------------------------------------------------------------------------------------ saving
@pytest.mark.parametrize("model_type", FAMILIES)
def test_save_pretrained_writes_a_complete_hub_repository(model_type, tmp_path):
    model = tiny_model(model_type)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    names = [cls.__name__ for cls in hf_layerfusion.FAMILIES[model_type]]
    assert config["auto_map"] == {
        "AutoConfig": f"modeling_layerfusion.{names[0]}",
        "AutoModel": f"modeling_layerfusion.{names[1]}",
        "AutoModelForSeq2SeqLM": f"modeling_layerfusion.{names[2]}",
    }
    assert config["custom_pipelines"]["translation"]["impl"] == "modeling_layerfusion.LayerFusionTranslationPipeline"
    assert (tmp_path / REMOTE_CODE_FILE).read_text() == generate_remote_code()
    with pytest.raises(ValueError, match=r"missing \['tokenizer_config.json', 'README.md'\]"):
        check_model_directory(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    hf_layerfusion.write_model_card(tmp_path, model, "de", "en", "tiny")
    check_model_directory(tmp_path)
    # with the package, the saved directory still loads with the package's classes, no remote code
    from transformers import AutoModelForSeq2SeqLM

    assert type(AutoModelForSeq2SeqLM.from_pretrained(tmp_path)) is type(model)


# ------------------------------------------------------------------------------------------------ Hub round trip
@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("label", ["v1", "v2"])
def test_remote_code_from_the_hub_matches_the_package(published, model_type, label):
    repo_id = f"{USER}/tiny-{model_type.replace('_', '-')}"
    reference = published["references"][(repo_id, label)]
    remote = published["remote"]["outputs"][f"{repo_id}@{label}"]
    assert set(remote) | {"pipeline", "pipeline_int8"} == set(reference)
    for key in ("logits", "logits_top_group"):
        if key in reference:
            difference = (remote[key] - reference[key]).abs().max().item()
            print(f"{model_type} {label} {key}: max |remote - package| = {difference}")
            assert difference == 0.0
    for key in ("beam", "beam_top_group"):
        if key in reference:
            assert torch.equal(remote[key], reference[key]), key
    if label == "v1":  # the consumer ran the Hub pipeline on the first revision
        assert remote["pipeline"] == reference["pipeline"]
        # int8 through the Hub code's own int8 copy (its classes are the package's; torch operations, no kernels):
        # the package's int8 translations (the int8 products are exact, the rest agrees to float rounding)
        assert remote["pipeline_int8"] == reference["pipeline_int8"]
    if tiny_model(model_type).config.num_decoder_groups > 1:  # the decoder_groups path was really exercised
        assert not torch.equal(reference["logits"], reference["logits_top_group"])


def test_hub_code_models_run_the_packages_inference_copies_where_the_package_is_installed(tmp_path):
    """A model loaded by its Hub code (classes of `transformers_modules....modeling_layerfusion`) before the package
    was imported: the package's copies take its classes as its own (`inference_copies.is_package_module`)."""
    model = tiny_model("gtrans")
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    script = textwrap.dedent(f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        import hf_layerfusion
        from hf_layerfusion.inference import prepare_for_inference
        from hf_layerfusion.inference.inference_copies import float32_kernel_available
        assert prepare_for_inference(model, "int8").prepared_for_inference == "int8"
        if float32_kernel_available():
            assert prepare_for_inference(model).prepared_for_inference == "float32"
        tokenizer = AutoTokenizer.from_pretrained({str(tmp_path / "model")!r})
        sources = ["ab ba", "abba baab ab"]
        assert hf_layerfusion.translate(model, tokenizer, sources, max_new_tokens=5) == hf_layerfusion.translate(
            model, tokenizer, sources, max_new_tokens=5, fast=False)
        print(hf_layerfusion.translate(model, tokenizer, sources, max_new_tokens=5, quantization="int8"))
    """)
    output = run_python(["-c", script], {"PYTHONPATH": str(REPO_ROOT)}, tmp_path).stdout
    assert output.strip().startswith("[")


def test_hub_code_refuses_a_model_type_edited_after_saving_as_the_package_does(tmp_path):
    """Issue 73: a GTrans checkpoint whose config.json says model_type 'rtal'. The package refuses it (it picks the
    class by model_type: RTAL's config gets GTrans' keys); the Hub code, whose class `auto_map` picks, ran it as GTrans.
    Loaded with `trust_remote_code=True` in a process that cannot import the package, it is refused too."""
    model_dir = tmp_path / "model"
    tiny_model("gtrans").save_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    (model_dir / "config.json").write_text(json.dumps({**config, "model_type": "rtal"}), encoding="utf-8")
    with pytest.raises(TypeError, match=r"RTALConfig.*key\(s\) of other families.*put the family's model_type back"):
        AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    script = without_package_preamble() + textwrap.dedent(f"""
        from transformers import AutoModelForSeq2SeqLM
        try:
            model = AutoModelForSeq2SeqLM.from_pretrained({str(model_dir)!r}, trust_remote_code=True)
        except ValueError as error:
            print("refused:", error)
        else:
            print("loaded as", type(model).__name__)
    """)
    output = run_python(["-S", "-c", script], {"HF_HOME": str(tmp_path / "home")}, tmp_path).stdout
    assert re.search(r"refused: .*model_type 'rtal'.*auto_map names GTransConfig.*model_type back \('gtrans'\)",
                     output), output


@pytest.mark.parametrize("model_type", FAMILIES)
def test_two_pushes_are_two_revisions_and_main_is_the_latest(published, model_type):
    repo_id = f"{USER}/tiny-{model_type.replace('_', '-')}"
    shas = published["shas"][repo_id]
    assert shas["v1"] != shas["v2"]
    outputs = published["remote"]["outputs"]
    assert not torch.equal(outputs[f"{repo_id}@v1"]["logits"], outputs[f"{repo_id}@v2"]["logits"])
    assert published["remote"]["main_sha"][repo_id] == shas["v2"]


def test_transformers_push_to_hub_carries_the_hub_code(published):
    remote = published["remote"]["outputs"][f"{published['transformers_repo']}@main"]
    reference = published["references"][(f"{USER}/tiny-gtrans", "v1")]
    assert torch.equal(remote["logits"], reference["logits"])
    assert remote["pipeline"] == reference["pipeline"]


def test_downloads_went_to_the_empty_hf_home_and_resave_keeps_the_code(published):
    files = published["remote"]["hf_home_files"]
    assert any(f.startswith("hub/models--test-user--tiny-gtrans/snapshots/") and f.endswith("model.safetensors") for f in files)
    assert any(f.endswith(REMOTE_CODE_FILE) and f.startswith("modules/transformers_modules/") for f in files)
    resaved = published["root"] / "resaved"
    assert (resaved / REMOTE_CODE_FILE).is_file()
    assert set(json.loads((resaved / "config.json").read_text())["auto_map"]) >= {"AutoConfig", "AutoModelForSeq2SeqLM"}


def test_missing_repo_revision_file_and_trust_remote_code_give_the_normal_errors(published):
    errors = published["remote"]["errors"]
    assert errors["missing_repo"][0] == "RepositoryNotFoundError"
    assert errors["missing_revision"][0] == "RevisionNotFoundError"
    assert errors["missing_file"][0] in {"RemoteEntryNotFoundError", "EntryNotFoundError"}
    kind, message = errors["no_trust_remote_code"]
    assert kind == "ValueError" and "trust_remote_code=True" in message
    assert published["hub"].unhandled == []  # the client needed nothing the test server lacks


def test_push_leaves_out_what_a_run_dir_holds_besides_the_model(hub, tmp_path, monkeypatch):
    """Pushing a run's output dir (issue 40): the model repository's files go up; the run's lock (`_run.lock`, which
    holds the command line), a temporary file that a killed atomic write left behind (`.<name>.<pid>.<hex>.tmp`, at
    the top or in a subdirectory), checkpoints, TensorBoard logs and the Trainer's state do not."""
    import huggingface_hub.constants

    from hf_layerfusion.file_checks import LOCK_FILE, lock_output_dir

    model = tiny_model("gtrans")
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    hf_layerfusion.write_model_card(tmp_path, model, "de", "en", "tiny")
    repository = sorted(path.name for path in tmp_path.iterdir())
    extra = {
        ".README.md.4242.0a1b2c3d.tmp": "half a card",
        "extra/.notes.txt.4242.0a1b2c3d.tmp": "half a note",
        "checkpoint-5/config.json": "{}",
        "runs/events.out.tfevents.1": "events",
        "trainer_state.json": "{}",
    }
    for name, text in extra.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "extra" / LOCK_FILE).write_text("pid 1: an earlier run's command line\n")
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
    repo_id = f"{USER}/pushed-from-a-run-dir"
    with lock_output_dir(tmp_path):  # pushed while the run still holds its dir
        hf_layerfusion.push_to_hub(tmp_path, repo_id, token="hf_test_token")
    repo = hub.httpd.repos[repo_id]
    uploaded = sorted(repo.commits[repo.branches["main"]])
    assert LOCK_FILE not in uploaded and f"extra/{LOCK_FILE}" not in uploaded
    assert uploaded == repository, uploaded
