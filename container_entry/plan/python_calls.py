"""Which calls of a Python script launch workers or start a launcher, read from its syntax tree
(never from its text, where a comment, a docstring or a string would count): the rules
plan/launchers applies to Python files.

A call counts when its function, resolved through the module's imports (`import
torch.multiprocessing as mp`, `from torch.multiprocessing import spawn`, `import torch`), is a
launching function (`mp.spawn`, `elastic_launch`, `notebook_launcher` ...), or starts a process
(`subprocess.run`, `os.system`, `os.execv` ...) whose command, known from literals, f-strings
and names bound once to them, is a launcher as the shell rules see it. Using
torch.multiprocessing for anything else (a sharing strategy, DataLoader workers) is no launch.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from collections.abc import Sequence

from container_entry.plan.shell_commands import Event, Follow, Launch, argv_events, script_events
from container_entry.plan.shell_words import Budget

# launching function -> the launcher, as a user names it
CALLS = {
    "torch.multiprocessing.spawn": "torch.multiprocessing.spawn",
    "torch.multiprocessing.spawn.spawn": "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes": "torch.multiprocessing.start_processes",
    "torch.multiprocessing.spawn.start_processes": "torch.multiprocessing.start_processes",
    "torch.distributed.elastic.multiprocessing.start_processes": (
        "torch.distributed.elastic.multiprocessing.start_processes"
    ),
    "torch.distributed.elastic.multiprocessing.api.start_processes": (
        "torch.distributed.elastic.multiprocessing.start_processes"
    ),
    "torch.distributed.launcher.api.elastic_launch": "elastic_launch",
    "torch.distributed.launcher.elastic_launch": "elastic_launch",
    "torch.distributed.launcher.api.launch_agent": "launch_agent",
    "torch.distributed.launcher.launch_agent": "launch_agent",
    "torch.distributed.run.main": "torch.distributed.run.main",
    "torch.distributed.run.run": "torch.distributed.run.run",
    "torch.distributed.launch.main": "torch.distributed.launch",
    "accelerate.notebook_launcher": "accelerate.notebook_launcher",
    "accelerate.launchers.notebook_launcher": "accelerate.notebook_launcher",
    "accelerate.debug_launcher": "accelerate.debug_launcher",
    "accelerate.launchers.debug_launcher": "accelerate.debug_launcher",
    "deepspeed.launcher.runner.main": "deepspeed",
    "horovod.run": "horovod.run",
    "horovod.runner.run": "horovod.run",
}
SHELL_TEXT = {  # the command is a shell text
    "os.system",
    "os.popen",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "asyncio.create_subprocess_shell",
}
SUBPROCESS = {  # a list, or a text
    "subprocess.run",
    "subprocess.Popen",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
}
# os.exec*, os.spawn*, os.posix_spawn*: where the program is among the arguments
PROGRAM_AT = {"os.exec": 0, "os.posix_spawn": 0, "os.spawn": 1}
ROOTS = {name.partition(".")[0] for name in [*CALLS, *SHELL_TEXT, *SUBPROCESS, *PROGRAM_AT]}
ROOTS |= {"runpy"}
UNKNOWN = "$_"  # a value not known from the code: like a shell variable never set
SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
MAX_DEPTH = 24  # names bound to names, nested expressions: how far a value is followed
MAX_EVALUATIONS = 20_000  # expressions evaluated in one module (a = b + b; b = c + c ...)
MAX_TEXT = 64 * 1024  # characters of a text built from the code

Bindings = tuple["_Scope", ...]  # the scopes around a call, innermost first
Value = str | list[str] | None  # a text, a command line as a list, or not known


def python_events(text: str, budget: Budget) -> list[Event] | None:
    """What the Python text launches or runs, in the order of its lines; None where it is no
    Python this interpreter can read (or too deep for it)."""
    if "import" not in text:
        return []  # names resolve through imports only: without one, no call can launch
    try:
        return _Module(ast.parse(budget.take(text)), budget).events()
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


class _Module:
    """One module, read in one pass: its imports, its calls, the names each scope binds."""

    def __init__(self, tree: ast.Module, budget: Budget) -> None:
        self.budget = budget
        self.evaluations = MAX_EVALUATIONS
        self.imports: dict[str, str] = {}  # local name -> the dotted name it stands for
        self.stars: list[str] = []  # modules imported with *
        self.calls: list[tuple[ast.Call, Bindings]] = []
        stack: list[tuple[ast.AST, Bindings]] = [(tree, (_Scope(),))]
        while stack:  # iteratively: a deep tree never exhausts the stack here
            node, scopes = stack.pop()
            scopes[0].note(node)
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._note_import(node)
            elif isinstance(node, ast.Call):
                self.calls.append((node, scopes))
            inner = (_Scope(), *scopes) if isinstance(node, SCOPES) and node is not tree else scopes
            stack.extend((child, inner) for child in ast.iter_child_nodes(node))

    def _note_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]
                self.imports[alias.asname or top] = alias.name if alias.asname else top
        elif node.module and not node.level:
            for alias in node.names:
                if alias.name == "*":
                    self.stars.append(node.module)
                else:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def events(self) -> list[Event]:
        imported = {name.partition(".")[0] for name in [*self.imports.values(), *self.stars]}
        if not imported & ROOTS:
            return []  # nothing here can launch or start a process
        found: list[tuple[int, int, list[Event]]] = []
        for call, bindings in self.calls:
            events = self._call(call, bindings)
            if events:
                found.append((call.lineno, call.col_offset, events))
        return [event for *_, events in sorted(found, key=lambda f: f[:2]) for event in events]

    def _call(self, call: ast.Call, bindings: Bindings) -> list[Event]:
        name = self._dotted(call.func, bindings)
        line = call.lineno
        if name is None:
            return []
        if name in CALLS:
            return [Launch(CALLS[name], line)]
        if name in ("runpy.run_path", "runpy.run_module") and call.args:
            path = self._value(call.args[0], bindings)
            if isinstance(path, str) and name.endswith("module"):
                path = path.replace(".", "/") + ".py"
            return [Follow(path, line, "python")] if isinstance(path, str) else []
        command = self._command(name, call, bindings)
        if isinstance(command, str):
            return [_shifted(event, line - 1) for event in script_events(command, self.budget)]
        if command:
            return list(argv_events(command, line, self.budget))
        return []

    def _command(self, name: str, call: ast.Call, bindings: Bindings) -> Value:
        """The command a process-starting call runs, as far as the code says."""
        args = list(call.args)
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        if name in SHELL_TEXT or name in SUBPROCESS:
            node = args[0] if args else keywords.get("args", keywords.get("command"))
            return self._value(node, bindings) if node is not None else None
        if name == "asyncio.create_subprocess_exec":
            return self._list(args, bindings)
        family = next((f for f in PROGRAM_AT if name.startswith(f)), None)
        if family is None or len(args) <= PROGRAM_AT[family]:
            return None
        program = self._value(args[PROGRAM_AT[family]], bindings)
        rest = args[PROGRAM_AT[family] + 1 :]
        if "l" in name.removeprefix(family):  # execl, spawnlp ...: the arguments one by one
            argv = self._list(rest, bindings)
        else:
            given = self._value(rest[0], bindings) if rest else None
            argv = given if isinstance(given, list) else [UNKNOWN]
        if not isinstance(program, str) or program == UNKNOWN:
            program = argv[0] if argv else UNKNOWN  # os.execvp(cmd[0], cmd)
        return [program, *argv[1:]]

    def _dotted(self, node: ast.expr, bindings: Bindings, depth: int = 0) -> str | None:
        """The dotted name an expression stands for, through the imports: `mp.spawn` is
        torch.multiprocessing.spawn after `import torch.multiprocessing as mp`."""
        attributes: list[str] = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.imports.get(node.id)
        if base is None:
            bound = _bound(bindings, node.id)
            if isinstance(bound, ast.Name | ast.Attribute) and depth < MAX_DEPTH:
                base = self._dotted(bound, bindings, depth + 1)
        if base is None:
            base = self._starred(node.id)
        return None if base is None else ".".join([base, *reversed(attributes)])

    def _starred(self, name: str) -> str | None:
        """A name from a `from MODULE import *`, where it is one of the names that matter."""
        for module in self.stars:
            dotted = f"{module}.{name}"
            if dotted in CALLS or dotted in SHELL_TEXT or dotted in SUBPROCESS:
                return dotted
            if any(dotted.startswith(family) for family in PROGRAM_AT):
                return dotted
        return None

    def _value(self, node: ast.expr, bindings: Bindings, depth: int = 0) -> Value:
        """What an expression holds, where the code says: a text, or a list of texts."""
        self.evaluations -= 1
        if depth > MAX_DEPTH or self.evaluations < 0:
            return None
        value = self._evaluated(node, bindings, depth)
        if isinstance(value, str) and len(value) > MAX_TEXT:
            return None
        return value if not isinstance(value, list) or len(value) <= MAX_TEXT else None

    def _evaluated(self, node: ast.expr, bindings: Bindings, depth: int) -> Value:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            return "".join(self._text(part, bindings, depth) for part in node.values)
        if isinstance(node, ast.List | ast.Tuple):
            return self._list(node.elts, bindings, depth)
        if isinstance(node, ast.BinOp):
            return self._operation(node, bindings, depth)
        if isinstance(node, ast.Call):
            return self._called(node, bindings, depth)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return _item(self._value(node.value, bindings, depth + 1), node.slice.value)
        if isinstance(node, ast.Name | ast.Attribute):
            if self._dotted(node, bindings) == "sys.executable":
                return "python"
            bound = _bound(bindings, node.id) if isinstance(node, ast.Name) else None
            return None if bound is None else self._value(bound, bindings, depth + 1)
        return None

    def _text(self, node: ast.expr, bindings: Bindings, depth: int) -> str:
        if isinstance(node, ast.FormattedValue):
            node = node.value
        value = self._value(node, bindings, depth + 1)
        return value if isinstance(value, str) else UNKNOWN

    def _list(self, nodes: Sequence[ast.expr], bindings: Bindings, depth: int = 0) -> list[str]:
        items: list[str] = []
        for node in nodes:
            if isinstance(node, ast.Starred):
                value = self._value(node.value, bindings, depth + 1)
                items += value if isinstance(value, list) else [UNKNOWN]
            else:
                items.append(self._text(node, bindings, depth))
        return items

    def _operation(self, node: ast.BinOp, bindings: Bindings, depth: int) -> Value:
        """`a + b` of texts or of lists (what is not known stays unknown); `"..." % x`."""
        left = self._value(node.left, bindings, depth + 1)
        if isinstance(node.op, ast.Mod):
            return left if isinstance(left, str) else None
        if not isinstance(node.op, ast.Add):
            return None
        right = self._value(node.right, bindings, depth + 1)
        if isinstance(left, list) or isinstance(right, list):
            return (left if isinstance(left, list) else [UNKNOWN]) + (
                right if isinstance(right, list) else [UNKNOWN]
            )
        if left is None and right is None:
            return None
        return (left or UNKNOWN) + (right or UNKNOWN)

    def _called(self, node: ast.Call, bindings: Bindings, depth: int) -> Value:
        """`" ".join(list)`, `"...".format(...)`, shlex.join, shlex.split, shutil.which,
        os.path.join, str()."""
        func = node.func
        first = self._value(node.args[0], bindings, depth + 1) if node.args else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Constant):
            receiver = func.value.value
            if isinstance(receiver, str) and func.attr == "join" and isinstance(first, list):
                return receiver.join(first)
            return receiver if isinstance(receiver, str) and func.attr == "format" else None
        name = self._dotted(func, bindings)
        if name == "shlex.join" and isinstance(first, list):
            return " ".join(first)
        if name == "os.path.join":  # os.path.join(BIN, "torchrun")
            return "/".join(self._text(arg, bindings, depth) for arg in node.args)
        return first if name in ("shlex.split", "shutil.which", "str", "os.fspath") else None


class _Scope:
    """The names one scope (the module, a function, a class, a lambda) binds: a name bound
    once (`cmd += [...]` keeps the binding) has a value known from the code."""

    def __init__(self) -> None:
        self.stores: Counter[str] = Counter()
        self.values: dict[str, ast.expr] = {}

    def note(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            self.stores[node.id] += 1
        elif isinstance(node, ast.arg):
            self.stores[node.arg] += 1
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            self.stores[node.target.id] -= 1
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and node.value is not None:
                self.values[target.id] = node.value


def _bound(bindings: Bindings, name: str) -> ast.expr | None:
    """The value of a name, from the innermost scope that binds it, if bound there once."""
    for scope in bindings:
        if name in scope.stores or name in scope.values:
            return scope.values.get(name) if scope.stores[name] == 1 else None
    return None


def _item(whole: Value, index: object) -> Value:
    """`cmd[0]` of a list known from the code."""
    if isinstance(whole, list) and isinstance(index, int) and -len(whole) <= index < len(whole):
        return whole[index]
    return None


def _shifted(event: Event, by: int) -> Event:
    return dataclasses.replace(event, line=event.line + by)
