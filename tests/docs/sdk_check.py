"""Check a Python doc block against the packages of the interpreter that runs this script.

    <venv>/bin/python -I tests/docs/sdk_check.py < blocks.json   (a JSON list of sources)

Standalone (stdlib only): it runs inside the SDK v2 / v3 venvs as well as the dev venv. It
imports what the block imports (every import must resolve) and, for names imported from
`sagemaker...`, checks by walking the block's AST without running it:

- every attribute reached from such a name exists (`Mode.LOCAL_CONTAINER`);
- every call of such a class or function binds: `inspect.signature(f).bind(...)` with the
  call's argument count and keyword names (values are placeholders);
- a keyword that binds only because the signature ends in `**kwargs` must be a named parameter
  somewhere in the class's MRO (the SDK v2 `Estimator` swallows unknown keywords silently);
- `x = SdkClass(...)` makes `x.method(...)` checked the same way against the class.

The last stdout line is `DOC-CHECK <json: per source, a list of "line N: message">`; the exit
status is 0 whenever the check itself ran.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys

SDK = "sagemaker"
MISSING = object()


def is_sdk(module: str) -> bool:
    return module == SDK or module.startswith(SDK + ".")


class Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.names: dict[str, object] = {}  # local name -> imported SDK object
        self.instances: dict[str, type] = {}  # local name -> SDK class it was built from

    def problem(self, node: ast.AST, message: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', 0)}: {message}")

    # ------------------------------------------------------------------ imports
    def load(self, node: ast.AST, module: str) -> object:
        try:
            return importlib.import_module(module)
        except Exception as exc:  # any failure to import is the finding
            self.problem(node, f"import {module} fails: {type(exc).__name__}: {exc}")
            return MISSING

    def imports(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    loaded = self.load(node, alias.name)
                    if loaded is MISSING or not is_sdk(alias.name):
                        continue
                    if alias.asname:
                        self.names[alias.asname] = loaded
                    else:
                        top = alias.name.split(".")[0]
                        self.names[top] = sys.modules[top]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    self.problem(node, "relative import in a doc block")
                    continue
                module = self.load(node, node.module or "")
                if module is MISSING:
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    value = getattr(module, alias.name, MISSING)
                    if value is MISSING:
                        try:
                            value = importlib.import_module(f"{node.module}.{alias.name}")
                        except Exception:
                            self.problem(node, f"cannot import {alias.name} from {node.module}")
                            continue
                    if is_sdk(node.module or ""):
                        self.names[alias.asname or alias.name] = value

    # ------------------------------------------------------------------ resolution
    def resolve(self, node: ast.expr) -> object:
        """The SDK object an expression names (Name / Attribute chains), else MISSING."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id, MISSING)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is MISSING:
                return MISSING
            value = getattr(base, node.attr, MISSING)
            if value is MISSING and inspect.ismodule(base):
                try:
                    value = importlib.import_module(f"{base.__name__}.{node.attr}")
                except Exception:
                    value = MISSING
            if value is MISSING:
                self.problem(node, f"{describe(base)} has no attribute {node.attr!r}")
            return value
        return MISSING

    def instances_of(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if not isinstance(value, ast.Call):
                continue
            made = self.resolve_quiet(value.func)
            if inspect.isclass(made):
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.instances[target.id] = made

    def resolve_quiet(self, node: ast.expr) -> object:
        seen = len(self.problems)
        value = self.resolve(node)
        del self.problems[seen:]
        return value

    # ------------------------------------------------------------------ calls
    def calls(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                self.resolve(node)  # attribute typos, in calls or not (duplicates dropped)
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in self.instances
            ):
                cls = self.instances[func.value.id]
                if inspect.getattr_static(cls, func.attr, MISSING) is MISSING:
                    if func.attr not in (getattr(cls, "model_fields", None) or {}):
                        self.problem(node, f"{describe(cls)} has no method {func.attr!r}")
                    continue
                self.check_call(node, getattr(cls, func.attr), cls, func.attr)
                continue
            target = self.resolve(func)
            if target is MISSING or not callable(target):
                continue
            if inspect.isclass(target):
                self.check_call(node, target, target, "__init__")
            else:
                self.check_call(node, target, None, None)

    def check_call(self, call: ast.Call, target, owner: type | None, method: str | None) -> None:
        name = describe(target) if method in (None, "__init__") else f"{describe(owner)}.{method}"
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return  # builtins without a signature: nothing to check
        params = signature.parameters
        positional = [p for p in call.args if not isinstance(p, ast.Starred)]
        starred = len(positional) != len(call.args) or any(k.arg is None for k in call.keywords)
        keywords = [k.arg for k in call.keywords if k.arg is not None]
        if method not in (None, "__init__") and inspect.isfunction(target):
            positional = [None, *positional]  # `self` of a plain method looked up on the class
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not starred:
            try:
                signature.bind(*[None] * len(positional), **dict.fromkeys(keywords))
            except TypeError as exc:
                self.problem(call, f"{name}(...) does not accept this call: {exc}")
                return
        named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        for keyword in keywords:
            if keyword in named:
                continue
            if not var_kw:
                if starred:
                    self.problem(call, f"{name}(...) has no parameter {keyword!r}")
                continue
            if owner is not None and keyword not in mro_parameters(owner, method or "__init__"):
                self.problem(
                    call,
                    f"{name}(...) has no parameter {keyword!r}: neither it nor any base class "
                    f"names it (it would vanish into **kwargs)",
                )


def mro_parameters(cls: type, method: str) -> set[str]:
    found: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        function = klass.__dict__.get(method)
        if function is None:
            continue
        function = getattr(function, "__func__", function)
        try:
            found.update(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            continue
    return found


def describe(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if inspect.ismodule(obj):
        return obj.__name__
    return f"{module}.{name}" if module and name else repr(obj)


def check(source: str) -> list[str]:
    checker = Checker()
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: {exc.msg}"]
    checker.imports(tree)
    checker.instances_of(tree)
    checker.calls(tree)
    return list(dict.fromkeys(checker.problems))


def main() -> int:
    sources = json.load(sys.stdin)
    print("DOC-CHECK " + json.dumps([check(source) for source in sources]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
