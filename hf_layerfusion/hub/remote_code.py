"""Hub sharing that works without the package: the self-contained modeling code every saved model carries.

`save_pretrained` (and therefore `push_to_hub` and the Trainer's checkpoints) of every family writes, next to
`config.json`, one file `modeling_layerfusion.py` holding every family's config and model classes and the
translation pipeline, and sets `auto_map` (AutoConfig, AutoModel, AutoModelForSeq2SeqLM) and `custom_pipelines`
in the config. A user without hf_layerfusion then loads the directory or Hub repository with
`AutoModelForSeq2SeqLM.from_pretrained(repo_id, trust_remote_code=True)`.

One source of truth: that file is *generated* from the package's own modules at save time, never kept by hand.
`generate_remote_code()` starts from the classes of every registered family (`hf_layerfusion.modeling.registry`) and
the pipeline class, and copies the top-level definitions they need, transitively through the package's own imports, into
one flat module in dependency order; imports of torch, transformers, huggingface_hub and the standard library are kept,
imports from the package are resolved to the inlined definitions. Anything it cannot inline (a package import of a whole
module, a package import inside a function, a dependency outside those libraries, two definitions of one name, a
top-level statement that is not a definition) raises `RemoteCodeError` naming the file and line, so a new family or a
backbone change cannot silently ship broken Hub code.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..file_checks import LOCK_FILE, write_file_atomically
from ..modeling.configuration import LayerFusionConfig
from ..modeling.input_checks import check_switch
from ..modeling.registry import FAMILIES, Family, family_of
from ..version import REMOTE_MODULE, TORCH_REQUIREMENT, TRANSFORMERS_HINT, TRANSFORMERS_REQUIREMENT, __version__
from .pipeline import HUB_PIPELINE_TASK, LayerFusionTranslationPipeline

PACKAGE = "hf_layerfusion"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
REMOTE_CODE_FILE = f"{REMOTE_MODULE}.py"
# what the Hub code may import besides the standard library: transformers' own requirements
RUNTIME_PACKAGES = frozenset({"torch", "transformers", "huggingface_hub", "safetensors"})
AUTO_CLASSES = ("AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM")


class RemoteCodeError(RuntimeError):
    """The package's modules cannot be flattened into self-contained Hub code."""


@dataclass
class _SourceModule:
    """One parsed package module: where each top-level name comes from."""

    name: str
    path: Path
    root: Path  # the directory holding the package (paths are shown relative to it)
    lines: list[str]
    # name -> ("package", module, name) | ("external", import line) | ("definition", statement index)
    bindings: dict[str, tuple] = field(default_factory=dict)
    statements: list[ast.stmt] = field(default_factory=list)
    package_imports: set[str] = field(default_factory=set)

    def where(self, node: ast.AST) -> str:
        return f"{self.path.relative_to(self.root)}:{node.lineno}"

    def source_of(self, node: ast.stmt) -> str:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(self.lines[start - 1 : node.end_lineno])


def _package_module(current: str, node: ast.ImportFrom | ast.Import) -> str | None:
    """Absolute name of the package module an import refers to, or None for an external import."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == PACKAGE:
                return alias.name
        return None
    if node.level == 0:
        return node.module if (node.module or "").split(".")[0] == PACKAGE else None
    base = current.split(".")[: -node.level]
    return ".".join(base + ([node.module] if node.module else []))


def _external_root(node: ast.ImportFrom | ast.Import) -> str:
    return (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]


def _bound_names(node: ast.stmt) -> list[str]:
    """Names a top-level definition, assignment or import block binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    names = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.append(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            names.extend((a.asname or a.name.split(".")[0]) for a in sub.names)
    return names


def _parse_module(name: str, package_dir: Path) -> _SourceModule:
    relative = name.split(".")[1:]
    path = package_dir.joinpath(*relative[:-1], f"{relative[-1]}.py") if relative else package_dir / "__init__.py"
    if not path.is_file():
        raise RemoteCodeError(f"Cannot inline {name}: no file {path} (only package modules can be inlined).")
    text = path.read_text(encoding="utf-8")
    module = _SourceModule(name=name, path=path, root=package_dir.parent, lines=text.splitlines(keepends=True))
    tree = ast.parse(text, filename=str(path))
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue  # the generated file starts with `from __future__ import annotations` itself
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            target = _package_module(name, node)
            if target is not None:
                if isinstance(node, ast.Import) or node.module is None:
                    raise RemoteCodeError(
                        f"{module.where(node)}: imports a package module as an object; the Hub code can only inline "
                        f"names (`from .module import name`)."
                    )
                module.package_imports.add(target)
                for alias in node.names:
                    module.bindings[alias.asname or alias.name] = ("package", target, alias.name)
                continue
            for alias in node.names:
                if isinstance(node, ast.ImportFrom):
                    line = f"from {node.module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                else:
                    line = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                # what the name is bound to: `from m import x` -> (m, x); `import a.b` -> (a, None)
                origin = (node.module, alias.name) if isinstance(node, ast.ImportFrom) else (alias.name, None)
                module.bindings[alias.asname or alias.name.split(".")[0]] = ("external", line, origin, node)
            continue
        if not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.If, ast.Try)
        ):
            raise RemoteCodeError(
                f"{module.where(node)}: top-level {type(node).__name__} statement; the Hub code generator copies only "
                "definitions, assignments and import blocks (move side effects into hf_layerfusion/__init__.py)."
            )
        module.statements.append(node)
        for bound in _bound_names(node):
            module.bindings[bound] = ("definition", len(module.statements) - 1)
    return module


class _Flattener:
    """Collects the definitions the roots need, across package modules, and writes them as one module."""

    def __init__(self, package_dir: Path = PACKAGE_DIR):
        self.package_dir = package_dir
        self.modules: dict[str, _SourceModule] = {}
        self.needed: dict[str, set[int]] = {}  # module -> statement indices
        self.aliases: dict[str, list[str]] = {}  # module -> `alias = name` lines for `import ... as` renames
        self.external: dict[str, str] = {}  # bound name -> import line
        self.owners: dict[str, tuple] = {}  # flat name -> what defines it (to detect clashes)

    def module(self, name: str) -> _SourceModule:
        if name not in self.modules:
            self.modules[name] = _parse_module(name, self.package_dir)
        return self.modules[name]

    def claim(self, flat_name: str, owner: tuple, where: str) -> bool:
        """Record who defines `flat_name`; False if already claimed by the same owner."""
        previous = self.owners.setdefault(flat_name, owner)
        if previous != owner:
            raise RemoteCodeError(
                f"{where}: `{flat_name}` is defined twice in the flattened Hub code ({previous[:2]} and {owner[:2]}); "
                "rename one of them."
            )
        return previous is owner

    def require(self, module_name: str, name: str, where: str) -> None:
        module = self.module(module_name)
        binding = module.bindings.get(name)
        if binding is None:
            raise RemoteCodeError(f"{where}: {module_name} has no top-level `{name}` to inline.")
        kind = binding[0]
        if kind == "package":
            _, target, target_name = binding
            self.require(target, target_name, f"{module.path.name} (import of {target}.{target_name})")
            if target_name != name and self.claim(name, ("alias", module_name, name), where):
                self.aliases.setdefault(module_name, []).append(f"{name} = {target_name}\n")
            return
        if kind == "external":
            _, line, (origin_module, origin_name), node = binding
            root = origin_module.split(".")[0]
            if root not in RUNTIME_PACKAGES and root not in sys.stdlib_module_names:
                raise RemoteCodeError(
                    f"{module.where(node)}: `{name}` comes from `{root}`, which the Hub code cannot require (allowed: "
                    f"the standard library and {sorted(RUNTIME_PACKAGES)})."
                )
            # two modules may import one object under one name by different paths (`transformers.X` and
            # `transformers.y.X`): the same owner, not a clash
            bound = importlib.import_module(origin_module)
            if origin_name is not None:  # a name, or a submodule (`from transformers import initialization`)
                if hasattr(bound, origin_name):
                    bound = getattr(bound, origin_name)
                else:
                    bound = importlib.import_module(f"{origin_module}.{origin_name}")
            if self.claim(name, ("external", id(bound)), where):
                self.external[name] = line
            return
        index = binding[1]
        if index in self.needed.setdefault(module_name, set()):
            return
        node = module.statements[index]
        for bound in _bound_names(node):
            self.claim(bound, ("definition", module_name, index), module.where(node))
        self.needed[module_name].add(index)
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)) and not isinstance(node, (ast.If, ast.Try)):
                if _package_module(module_name, sub) is not None:
                    raise RemoteCodeError(
                        f"{module.where(sub)}: a package import inside a function or class; the Hub code generator "
                        "inlines top-level imports only."
                    )
            if isinstance(node, (ast.If, ast.Try)) and isinstance(sub, (ast.Import, ast.ImportFrom)):
                if _package_module(module_name, sub) is not None or (
                    _external_root(sub) not in RUNTIME_PACKAGES and _external_root(sub) not in sys.stdlib_module_names
                ):
                    raise RemoteCodeError(f"{module.where(sub)}: this import block cannot go into the Hub code.")
        used = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}
        for used_name in sorted(used - set(_bound_names(node))):
            if used_name in module.bindings:
                self.require(module_name, used_name, module.where(node))

    def module_order(self) -> list[str]:
        """The modules that contribute code, each after the package modules it imports from."""
        contributing = set(self.needed) | set(self.aliases)
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in order:
                return
            if name in visiting:
                raise RemoteCodeError(f"Import cycle through {name}: the flattened Hub code has no valid order.")
            visiting.add(name)
            for dependency in sorted(self.modules[name].package_imports & contributing):
                visit(dependency)
            order.append(name)

        for name in sorted(contributing):
            visit(name)
        return order

    def render(self) -> str:
        order = self.module_order()
        sources = ", ".join(str(self.modules[m].path.relative_to(self.package_dir.parent)) for m in order)
        parts = [
            f'"""Self-contained Hub code of hf_layerfusion {__version__}: every family\'s config and model classes and '
            f"the translation pipeline.\n\nRequires {TRANSFORMERS_REQUIREMENT} and {TORCH_REQUIREMENT} (which transformers "
            "enforces itself: it disables an older torch).\n\n"
            "Generated by `hf_layerfusion.generate_remote_code()` from "
            f"{sources}.\nDo not edit: the package is the source of truth; `save_pretrained` rewrites this file.\n"
            '"""\n\nfrom __future__ import annotations\n\n',
            "".join(f"{line}\n" for line in sorted(set(self.external.values()))),
            # the package's own check (hf_layerfusion/version.py): the user's transformers runs this file
            "\nfrom transformers.utils.versions import require_version as _require_version\n\n"
            f"_require_version({TRANSFORMERS_REQUIREMENT!r}, {TRANSFORMERS_HINT!r})\n",
        ]
        for module_name in order:
            module = self.modules[module_name]
            indices = sorted(self.needed.get(module_name, ()))
            if not indices and module_name not in self.aliases:
                continue
            parts.append(f"\n\n# {'-' * 40} from {module.path.relative_to(self.package_dir.parent)}\n")
            parts.extend(self.aliases.get(module_name, []))
            for index in indices:
                parts.append("\n\n" + module.source_of(module.statements[index]))
        return "".join(parts)


def _root_classes() -> list[type]:
    return [cls for classes in FAMILIES.values() for cls in classes] + [LayerFusionTranslationPipeline]


def generate_remote_code() -> str:
    """The source of `modeling_layerfusion.py`, flattened from the package's current modules (see module docstring)."""
    flattener = _Flattener()
    for cls in _root_classes():
        if not cls.__module__.startswith(f"{PACKAGE}."):
            raise RemoteCodeError(f"{cls.__qualname__} is defined outside {PACKAGE} ({cls.__module__}).")
        flattener.require(cls.__module__, cls.__name__, f"root class {cls.__module__}.{cls.__name__}")
    code = flattener.render()
    tree = ast.parse(code, filename=REMOTE_CODE_FILE)
    leaked = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _package_module(REMOTE_MODULE, node) is not None
    ]
    if leaked:
        raise RemoteCodeError(f"Generated Hub code still imports {PACKAGE} at lines {leaked}.")
    return code


def registered_family(config: LayerFusionConfig) -> Family:
    """The family whose config class is exactly `config`'s (its Hub code names those classes)."""
    family = family_of(config)
    if family is None or family.config is not type(config):
        raise RemoteCodeError(
            f"{type(config).__qualname__} is not the config class of a registered family ({sorted(FAMILIES)}); "
            "register its family (`@register_family` in its module under hf_layerfusion/models/) so that its Hub "
            "code can be generated."
        )
    return family


def write_remote_code(config: LayerFusionConfig, save_directory: str | os.PathLike) -> Path:
    """Write `modeling_layerfusion.py` into `save_directory` and point `config.auto_map` / `config.custom_pipelines`
    at it (the caller then writes `config.json`). Called by `LayerFusionConfig.save_pretrained`."""
    classes = registered_family(config)
    save_directory = Path(save_directory)
    save_directory.mkdir(parents=True, exist_ok=True)
    # whole or not at all: a save cut short (a full disk) must not leave Hub code that stops in mid-statement
    path = write_file_atomically(save_directory / REMOTE_CODE_FILE, generate_remote_code(), what="Hub code")
    config.auto_map = {auto: f"{REMOTE_MODULE}.{cls.__name__}" for auto, cls in zip(AUTO_CLASSES, classes)}
    config.custom_pipelines = {
        HUB_PIPELINE_TASK: {
            "impl": f"{REMOTE_MODULE}.{LayerFusionTranslationPipeline.__name__}",
            "pt": ["AutoModelForSeq2SeqLM"],
            "type": "text",
        }
    }
    return path


# files a complete model repository needs besides the weights (`model.safetensors` or a sharded index)
REQUIRED_FILES = ("config.json", REMOTE_CODE_FILE, "generation_config.json", "tokenizer_config.json", "README.md")


def check_model_directory(model_dir: str | os.PathLike) -> None:
    """Raise a `ValueError` listing what `model_dir` lacks to be a complete Hub repository: weights, config with
    `auto_map`, the Hub code (which must compile: `check_hub_code`), generation config, tokenizer and a model card
    whose metadata the Hub accepts."""
    from huggingface_hub import ModelCard

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Model directory {model_dir} does not exist.")
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if not any((model_dir / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        missing.append("model.safetensors")
    if missing:
        raise ValueError(
            f"{model_dir} is not a complete model repository; missing {missing}. Save the model "
            "(`model.save_pretrained`), the tokenizer (`tokenizer.save_pretrained`) and the model card "
            "(`hf_layerfusion.write_model_card`) there."
        )
    auto_map = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("auto_map", {})
    if set(AUTO_CLASSES) - set(auto_map):
        raise ValueError(f"{model_dir / 'config.json'} has no `auto_map` for {AUTO_CLASSES}; re-save the model.")
    check_hub_code(model_dir / REMOTE_CODE_FILE)
    ModelCard.load(model_dir / "README.md", ignore_metadata_errors=False)


def check_hub_code(path: Path) -> None:
    """A saved model's `modeling_layerfusion.py` compiles: one cut short (an interrupted copy or download) or
    edited is refused naming the file and the line, where transformers' loader raises a `SyntaxError` naming
    neither (it parses the file as "<unknown>")."""
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:  # ValueError: null bytes
        directory = str(path.parent)
        raise ValueError(
            f"Hub code {str(path)!r} is damaged or cut short ({error}): loading the model "
            "without hf_layerfusion, or its pipeline, would fail. Refresh it from the installed package: "
            f"`AutoConfig.from_pretrained({directory!r}).save_pretrained({directory!r})` rewrites it (and config.json)."
        ) from error


# what a run's output dir holds that is no part of the model repository: checkpoints, TensorBoard logs, optimizer
# and Trainer state, `_*` files as `Trainer.push_to_hub` leaves them out (`_run.lock` holds the run's command line:
# `file_checks.lock_output_dir`), and the temporary files of `file_checks.write_file_atomically`
# (`.<name>.<pid>.<hex>.tmp`) that a killed process leaves behind, at the top or in a subdirectory
UPLOAD_IGNORE_PATTERNS = [
    "checkpoint-*/**", "runs/**", "*.pt", "*.pth", "trainer_state.json", "training_args.bin", "_*", f"*/{LOCK_FILE}",
    ".*.tmp", "*/.*.tmp",
]


def _hub_transport_errors() -> tuple[type[BaseException], ...]:
    """The errors of a request that reached no server: the transport errors of the HTTP library of the installed
    huggingface_hub (httpx2 from huggingface_hub 2, httpx before), and `ConnectionError` (its offline mode)."""
    try:
        from httpx2 import TransportError
    except ImportError:
        from httpx import TransportError
    return TransportError, ConnectionError


def push_to_hub(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    revision: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload hf_layerfusion model",
):
    """Check that `model_dir` is a complete repository (`check_model_directory`), create `repo_id` if needed and
    upload the directory in one commit; returns the `CommitInfo`. The endpoint and token are huggingface_hub's
    (`HF_ENDPOINT`, `HF_TOKEN` or `hf auth login`)."""
    from huggingface_hub import HfApi

    check_switch(private, "private", allow_none=True)  # "no" is truthy: the repository would be created private
    check_model_directory(model_dir)
    api = HfApi()
    try:  # the first request: a Hub out of reach is named before anything is uploaded
        api.create_repo(repo_id, token=token, private=private, exist_ok=True)
    except _hub_transport_errors() as error:
        raise ConnectionError(
            f"Could not reach the Hub at {api.endpoint} to create {repo_id!r} ({type(error).__name__}: {error}); "
            "nothing was uploaded. Check the network (or its proxy: HTTPS_PROXY), or set HF_ENDPOINT to a reachable "
            "Hub-compatible server before starting Python, with a write token (HF_TOKEN=hf_..., `hf auth login`, or "
            "token=...)."
        ) from error
    if revision is not None:
        api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=model_dir,
        revision=revision,
        token=token,
        commit_message=commit_message,
        ignore_patterns=UPLOAD_IGNORE_PATTERNS,
    )

