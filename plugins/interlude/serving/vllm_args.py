"""Would real vLLM accept the `vllm serve` command line the Deployment renders?

Why: a flag vLLM does not know, a value of the wrong type or an unknown load format makes every replica
crash-loop after the nodes are paid for. So the plan checks each vLLM container's args before anything is
applied: with vLLM's own parser when vLLM is installed (``make_arg_parser``, as ``vllm serve`` builds it),
else with the flag table ``vllm_serve_flags.yaml`` (each flag from vLLM's CLI reference, source named in the
file), turned into an argparse parser of the same shape. Pure: no network, reads the table once.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

FLAGS_PATH = Path(str(resources.files("interlude.serving") / "vllm_serve_flags.yaml"))  # package data
_TYPES: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float, "json": json.loads}


class RefusedArgs(ValueError):
    """What argparse would have printed before exiting with status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints usage and exits 2; here: a refusal to report
        raise RefusedArgs(message)


@functools.lru_cache(maxsize=2)
def load_flags(path: str = str(FLAGS_PATH)) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, Mapping) or not isinstance(data.get("flags"), Mapping):
        raise ValueError(f"{path}: expected a mapping with 'flags'")
    return dict(data)


def _add_flag(parser: argparse.ArgumentParser, name: str, row: Mapping[str, Any]) -> None:
    names = [name, *row.get("aliases", ())]
    kind = str(row["type"])
    if kind == "bool":
        parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=None)
    elif kind == "flag":
        parser.add_argument(*names, action="store_true")
    else:
        parser.add_argument(*names, type=_TYPES[kind], nargs=row.get("nargs"))


def table_parser(flags: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """`vllm serve`'s parser for the flags in the table (allow_abbrev off: vLLM's parser refuses prefixes too)."""
    flags = flags or load_flags()
    parser = _Parser(prog="vllm serve", allow_abbrev=False)
    parser.add_argument(str(flags.get("positional", "model_tag")), nargs="?")
    for name, row in flags["flags"].items():
        _add_flag(parser, str(name), row)
    return parser


def _vllm_parser() -> argparse.ArgumentParser | None:
    """vLLM's own `vllm serve` parser, when vLLM is installed (https://docs.vllm.ai/en/latest/cli/serve/)."""
    try:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # vLLM before 0.11 kept it in vllm.utils
            from vllm.utils import FlexibleArgumentParser
    except ImportError:
        return None

    class _Vllm(FlexibleArgumentParser):
        def error(self, message: str) -> Any:
            raise RefusedArgs(message)

    parser = _Vllm(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?")
    return make_arg_parser(parser)  # type: ignore[no-any-return]


def _known_values(namespace: argparse.Namespace, flags: Mapping[str, Any]) -> list[str]:
    """Values argparse takes but vLLM refuses later (a load format no loader is registered for)."""
    out = []
    for name, row in flags["flags"].items():
        value = getattr(namespace, str(name).lstrip("-").replace("-", "_"), None)
        known = row.get("known")
        if known and value is not None and value not in known:
            out.append(
                f"{name}: {value!r} is not supported by vLLM (Load format `{value}` is not supported; known: "
                f"{', '.join(known)})"
            )
    return out


def check_serve_args(args: Sequence[str], *, use_vllm: bool = True) -> list[str]:
    """Why vLLM would refuse `vllm serve ARGS` ([] when it accepts them). `args` follow `serve`."""
    flags = load_flags()
    parser = (_vllm_parser() if use_vllm else None) or table_parser(flags)
    try:
        namespace = parser.parse_args(list(args))
    except RefusedArgs as exc:
        return [f"vllm serve: {exc} (source: {flags['source']})"]
    problems = _known_values(namespace, flags)
    if not (getattr(namespace, "model_tag", None) or getattr(namespace, "model", None)):
        problems.append("vllm serve: no model given (vLLM would serve its built-in default model)")
    return problems


def serve_args_of(container: Mapping[str, Any]) -> list[str] | None:
    """The args after `vllm serve` in a container's command + args, as the container gets them ($$ -> $)."""
    argv = [str(a).replace("$$", "$") for a in (container.get("command") or []) + (container.get("args") or [])]
    for i in range(len(argv) - 1):
        if argv[i] == "vllm" and argv[i + 1] == "serve":
            return argv[i + 2 :]
    return None


def deployment_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Each vLLM container of a Deployment whose `vllm serve` args vLLM would refuse, named."""
    if manifest.get("kind") != "Deployment":
        return []
    problems = []
    for container in manifest["spec"]["template"]["spec"].get("containers") or []:
        args = serve_args_of(container)
        if args is not None:
            problems += [
                f"Deployment/{manifest['metadata']['name']} container {container['name']}: {p}"
                for p in check_serve_args(args)
            ]
    return problems
