"""Whether an entry point launches its own workers (plan/launchers), over the whole class: each
launcher, each way a shell script or a Python script can start it, the files it runs; then what
only mentions a launcher and must not count; then hostile input, which must neither raise nor
take long."""

import time

import pytest

from container_entry.plan.launchers import Finding, find_launcher

SPAWN = "import torch.multiprocessing as mp\n\n\ndef main():\n    mp.spawn(worker, nprocs=4)\n"
PLAIN = "import torch\n\n\ndef main():\n    print(torch.cuda.device_count())\n"


def judge(files: dict[str, str | bytes], entry: str | None = None) -> Finding | None:
    """The finding for the first file named (or `entry`), texts given as str or bytes."""
    data = {name: text.encode() if isinstance(text, str) else text for name, text in files.items()}
    return find_launcher(entry or next(iter(files)), data)


def found(files: dict[str, str | bytes], entry: str | None = None) -> tuple | None:
    finding = judge(files, entry)
    return None if finding is None else (finding.launcher, finding.file, finding.line)


# (a shell entry point run.sh, the launcher, the line)
SHELL = [
    # each launcher
    ("torchrun --nproc_per_node 8 train.py", "torchrun", 1),
    (
        "python -m torch.distributed.run --nproc_per_node 2 t.py",
        "python -m torch.distributed.run",
        1,
    ),
    ("python3 -m torch.distributed.launch --use-env t.py", "torch.distributed.launch", 1),
    ("python3.10 -m torch.distributed.launch --use_env t.py", "torch.distributed.launch", 1),
    ("python -m torch.distributed.launch t.py", "torch.distributed.launch", 1),
    ("python -m accelerate.commands.launch t.py", "accelerate launch", 1),
    ("python -m deepspeed.launcher.runner t.py", "deepspeed", 1),
    ("python -m deepspeed t.py", "deepspeed", 1),
    ("accelerate launch --num_processes 8 t.py", "accelerate launch", 1),
    ("deepspeed --num_gpus 8 t.py --deepspeed ds.json", "deepspeed", 1),
    ("mpirun -np 8 python t.py", "mpirun", 1),
    ("mpiexec -n 8 python t.py", "mpiexec", 1),
    ("horovodrun -np 8 python t.py", "horovodrun", 1),
    # command words: paths, quotes, interpreters
    ("/opt/conda/bin/torchrun --standalone t.py", "torchrun", 1),
    ('"torchrun" t.py', "torchrun", 1),
    ("'/usr/local/bin/torchrun' t.py", "torchrun", 1),
    (
        "/opt/conda/bin/python3 -u -m torch.distributed.run t.py",
        "python -m torch.distributed.run",
        1,
    ),
    ("python -mtorch.distributed.run t.py", "python -m torch.distributed.run", 1),
    ("python -W ignore -X dev -m torch.distributed.run t.py", "python -m torch.distributed.run", 1),
    ("$PYTHON -m torch.distributed.run t.py", "python -m torch.distributed.run", 1),
    ('"${PYTHON}" -m torch.distributed.run t.py', "python -m torch.distributed.run", 1),
    ("${PYTHON:-python3} -m torch.distributed.run t.py", "python -m torch.distributed.run", 1),
    ("$BIN/torchrun t.py", "torchrun", 1),
    # prefixes
    ("exec torchrun t.py", "torchrun", 1),
    ("env torchrun t.py", "torchrun", 1),
    ("env -i A=1 torchrun t.py", "torchrun", 1),
    ("env -u HOME NCCL_DEBUG=INFO torchrun t.py", "torchrun", 1),
    ("env -S 'torchrun --standalone' t.py", "torchrun", 1),
    ("nohup torchrun t.py > train.log 2>&1 &", "torchrun", 1),
    ("time torchrun t.py", "torchrun", 1),
    ("time -p torchrun t.py", "torchrun", 1),
    ("command torchrun t.py", "torchrun", 1),
    ("nice -n 10 torchrun t.py", "torchrun", 1),
    ("stdbuf -oL torchrun t.py", "torchrun", 1),
    ("stdbuf -o L -e L torchrun t.py", "torchrun", 1),
    ("setsid torchrun t.py", "torchrun", 1),
    ("sudo -E -u ubuntu torchrun t.py", "torchrun", 1),
    ("timeout -s KILL 3600 torchrun t.py", "torchrun", 1),
    ("NCCL_DEBUG=INFO OMP_NUM_THREADS=1 torchrun t.py", "torchrun", 1),
    ("exec env A=1 nohup nice -n 5 torchrun t.py", "torchrun", 1),
    ("uv run --with x torchrun t.py", "torchrun", 1),
    ("conda run -n train torchrun t.py", "torchrun", 1),
    # reserved words, lists, pipes, groups
    ("if true; then torchrun t.py; fi", "torchrun", 1),
    ("if [ $# -gt 0 ]; then torchrun t.py; fi", "torchrun", 1),
    ("! torchrun t.py", "torchrun", 1),
    ("{ torchrun t.py; }", "torchrun", 1),
    ("while true; do torchrun t.py; done", "torchrun", 1),
    ("set -e\necho start && torchrun t.py", "torchrun", 2),
    ("false || torchrun t.py", "torchrun", 1),
    ("echo a; torchrun t.py", "torchrun", 1),
    ("torchrun t.py | tee train.log", "torchrun", 1),
    ("torchrun t.py &\nwait", "torchrun", 1),
    ("(cd /opt/ml/code && torchrun t.py)", "torchrun", 1),
    ("train() {\n  torchrun t.py\n}\ntrain", "torchrun", 2),
    ("function train {\n  deepspeed t.py\n}\ntrain", "deepspeed", 2),
    ("case $1 in\n  run) torchrun t.py ;;\nesac", "torchrun", 2),
    ("X=${X#prefix} torchrun t.py # a comment", "torchrun", 1),
    # substitutions
    ("OUT=$(torchrun --nproc_per_node 1 t.py)", "torchrun", 1),
    ('echo "$(torchrun t.py)"', "torchrun", 1),
    ("echo `torchrun t.py`", "torchrun", 1),
    ('echo "`torchrun t.py`"', "torchrun", 1),
    ("echo $(date) $(torchrun t.py)", "torchrun", 1),
    # line continuations, multi-line quotes, here-documents before the command
    ("torchrun \\\n  --nproc_per_node 8 \\\n  train.py", "torchrun", 1),
    ("NCCL_DEBUG=INFO \\\n  torchrun t.py", "torchrun", 2),
    ("echo 'one\ntwo'\ntorchrun t.py", "torchrun", 3),
    ("cat <<EOF\ntorchrun in the body\nEOF\ntorchrun t.py", "torchrun", 4),
    ("cat <<-'EOF' > x\n\ttorchrun\n\tEOF\nmpirun x", "mpirun", 4),
    # variables that are run
    ("X=torchrun\n$X train.py", "torchrun", 2),
    ('LAUNCHER="torchrun --nproc_per_node 2"\n$LAUNCHER train.py', "torchrun", 2),
    (
        'export CMD="python -m torch.distributed.run --nproc_per_node 2"\n"$CMD" t.py',
        "python -m torch.distributed.run",
        2,
    ),
    ("declare -r X=torchrun\n${X} t.py", "torchrun", 2),
    ("readonly X=deepspeed\n$X t.py", "deepspeed", 2),
    ("train() {\n  local L=torchrun\n  $L t.py\n}", "torchrun", 3),
    ('CMD=(torchrun --nproc_per_node 2)\n"${CMD[@]}" train.py', "torchrun", 2),
    ('PY=python3\nCMD="$PY -m torch.distributed.launch"\n$CMD t.py', "torch.distributed.launch", 3),
    ('L="${L:-torchrun}"\n$L t.py', "torchrun", 2),
    ('CMD="torchrun t.py"\neval "$CMD"', "torchrun", 2),
    ("CMD='torchrun t.py'\neval $CMD", "torchrun", 2),
    ("eval torchrun t.py", "torchrun", 1),
    # bash -c and friends
    ("bash -c 'torchrun t.py'", "torchrun", 1),
    ('sh -c "exec torchrun t.py"', "torchrun", 1),
    ("bash -lc 'cd /x && torchrun t.py'", "torchrun", 1),
    ('bash -c "echo hi\ntorchrun t.py"', "torchrun", 2),
    ('X=torchrun\nbash -c "$X t.py"', "torchrun", 2),
    (
        "python -c 'import torch.multiprocessing as mp; mp.spawn(f)'",
        "torch.multiprocessing.spawn",
        1,
    ),
    # odd text
    ("echo hi\r\ntorchrun t.py\r\n", "torchrun", 2),
    ("\ufefftorchrun t.py", "torchrun", 1),
    ("echo 'unclosed\ntorchrun t.py\n", "torchrun", 2),
    ("torchrun t.py \\", "torchrun", 1),
]


@pytest.mark.parametrize(("script", "launcher", "line"), SHELL)
def test_a_shell_entry_point_that_runs_a_launcher_is_found_at_its_line(script, launcher, line):
    assert found({"run.sh": script, "t.py": PLAIN, "train.py": PLAIN}) == (launcher, "run.sh", line)


# (a Python entry point train.py, the launcher, the line)
PYTHON = [
    (SPAWN, "torch.multiprocessing.spawn", 5),
    ("from torch import multiprocessing as mp\nmp.spawn(f)", "torch.multiprocessing.spawn", 2),
    ("from torch.multiprocessing import spawn\nspawn(f)", "torch.multiprocessing.spawn", 2),
    ("from torch.multiprocessing import spawn as go\ngo(f)", "torch.multiprocessing.spawn", 2),
    ("import torch\ntorch.multiprocessing.spawn(f)", "torch.multiprocessing.spawn", 2),
    (
        "import torch.multiprocessing\ntorch.multiprocessing.spawn(f)",
        "torch.multiprocessing.spawn",
        2,
    ),
    ("import torch.multiprocessing.spawn as s\ns.spawn(f)", "torch.multiprocessing.spawn", 2),
    (
        "import torch.multiprocessing as mp\nmp.start_processes(f, start_method='fork')",
        "torch.multiprocessing.start_processes",
        2,
    ),
    (
        "from torch.multiprocessing.spawn import start_processes\nstart_processes(f)",
        "torch.multiprocessing.start_processes",
        2,
    ),
    (
        "from torch.distributed.elastic.multiprocessing import start_processes\nstart_processes()",
        "torch.distributed.elastic.multiprocessing.start_processes",
        2,
    ),
    (
        "from torch.distributed.launcher.api import elastic_launch\nelastic_launch(c, fn)(x)",
        "elastic_launch",
        2,
    ),
    (
        "from torch.distributed.launcher import elastic_launch, LaunchConfig\n"
        "cfg = LaunchConfig(1, 1, 2)\nelastic_launch(cfg, fn)()",
        "elastic_launch",
        3,
    ),
    ("import torch.distributed.launcher as pet\npet.elastic_launch(c, f)(1)", "elastic_launch", 2),
    (
        "from torch.distributed.launcher.api import launch_agent\nlaunch_agent(c, f, [])",
        "launch_agent",
        2,
    ),
    (
        "from torch.distributed.run import main as torchrun\ntorchrun(['--nproc_per_node', '2'])",
        "torch.distributed.run.main",
        2,
    ),
    ("import torch.distributed.run as tdr\ntdr.run(args)", "torch.distributed.run.run", 2),
    ("from torch.distributed import launch\nlaunch.main()", "torch.distributed.launch", 2),
    (
        "from accelerate import notebook_launcher\nnotebook_launcher(f, num_processes=2)",
        "accelerate.notebook_launcher",
        2,
    ),
    ("import accelerate\naccelerate.notebook_launcher(f)", "accelerate.notebook_launcher", 2),
    (
        "from accelerate.launchers import debug_launcher\ndebug_launcher(f)",
        "accelerate.debug_launcher",
        2,
    ),
    ("from torch.multiprocessing import *\nspawn(f)", "torch.multiprocessing.spawn", 2),
    # anywhere: under __main__, in methods, through a name bound to the function
    (
        "if __name__ == '__main__':\n    import torch.multiprocessing as mp\n    mp.spawn(f)",
        "torch.multiprocessing.spawn",
        3,
    ),
    (
        "import torch.multiprocessing as mp\nclass T:\n    def run(self):\n"
        "        mp.spawn(self.f)",
        "torch.multiprocessing.spawn",
        4,
    ),
    (
        "import torch.multiprocessing as mp\nlaunch = mp.spawn\nlaunch(f)",
        "torch.multiprocessing.spawn",
        3,
    ),
    # processes whose command is a launcher
    (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2'])",
        "python -m torch.distributed.run",
        2,
    ),
    ("import subprocess\nsubprocess.check_call(['torchrun', 'x.py'])", "torchrun", 2),
    ("import subprocess\nsubprocess.Popen('torchrun x.py', shell=True)", "torchrun", 2),
    ("import subprocess as sp\nsp.call(['deepspeed', 'x.py'])", "deepspeed", 2),
    ("from subprocess import run\nrun(['accelerate', 'launch', 'x.py'])", "accelerate launch", 2),
    ("import subprocess\nsubprocess.check_output(args=['mpirun', '-np', '2', 'x'])", "mpirun", 2),
    ("import os\nos.system('torchrun --nproc_per_node 2 x.py')", "torchrun", 2),
    ("import os\nn = 8\nos.system(f'torchrun --nproc_per_node {n} x.py')", "torchrun", 3),
    ("import os\nos.popen('horovodrun -np 2 python x.py')", "horovodrun", 2),
    (
        "import os, sys\nos.execv(sys.executable,"
        " [sys.executable, '-m', 'torch.distributed.launch', '--use_env', 'x.py'])",
        "torch.distributed.launch",
        2,
    ),
    ("import os\nos.execvp('torchrun', ['torchrun', 'x.py'])", "torchrun", 2),
    ("import os\nos.execlp('torchrun', 'torchrun', 'x.py')", "torchrun", 2),
    ("import os\nos.spawnlp(os.P_WAIT, 'torchrun', 'torchrun', 'x.py')", "torchrun", 2),
    ("import asyncio\nasyncio.create_subprocess_exec('torchrun', 'x.py')", "torchrun", 2),
    ("import asyncio\nasyncio.create_subprocess_shell('cd x && torchrun x.py')", "torchrun", 2),
    (
        "import subprocess, sys\nCMD = [sys.executable, '-m', 'torch.distributed.run', 'x.py']\n\n"
        "def main():\n    subprocess.run(CMD)\n",
        "python -m torch.distributed.run",
        5,
    ),
    (
        "import subprocess\ndef main(n):\n    cmd = ['torchrun', f'--nproc_per_node={n}', 'x.py']\n"
        "    cmd += ['--lr', '1']\n    subprocess.run(cmd, check=True)",
        "torchrun",
        5,
    ),
    ("import os\ncmd = ['torchrun', 'x.py']\nos.execvp(cmd[0], cmd)", "torchrun", 3),
    (
        "import subprocess\nLAUNCH = 'torchrun --nproc_per_node 2 x.py'\n"
        "subprocess.run(LAUNCH, shell=True)",
        "torchrun",
        3,
    ),
    ("import subprocess\nsubprocess.run(['bash', '-c', 'torchrun x.py'])", "torchrun", 2),
    (
        "import subprocess\nsubprocess.run(' '.join(['torchrun', 'x.py']), shell=True)",
        "torchrun",
        2,
    ),
    ("import subprocess, shlex\nsubprocess.run(shlex.split('torchrun x.py'))", "torchrun", 2),
    (
        "import subprocess\nsubprocess.run(['python', '-c', 'import torch.multiprocessing as mp\\n"
        "mp.spawn(f)'])",
        "torch.multiprocessing.spawn",
        3,
    ),
    (
        "import subprocess\nsubprocess.run(['env', 'A=1', 'python3', '-m', 'deepspeed', 'x'])",
        "deepspeed",
        2,
    ),
    (
        "import os, shutil, subprocess\nsubprocess.run([shutil.which('torchrun'), 'x.py'])",
        "torchrun",
        2,
    ),
    ("import os\nos.execv(os.path.join(BIN, 'torchrun'), ['torchrun', 'x.py'])", "torchrun", 2),
    ("import os\nos.system(command='torchrun x.py')", "torchrun", 2),
    # odd text
    ("import torch.multiprocessing as mp\r\n\r\nmp.spawn(f)\r\n", "torch.multiprocessing.spawn", 3),
    ("\ufeffimport torch.multiprocessing as mp\nmp.spawn(f)", "torch.multiprocessing.spawn", 2),
]


@pytest.mark.parametrize(("script", "launcher", "line"), PYTHON)
def test_a_python_entry_point_that_launches_is_found_at_its_call(script, launcher, line):
    assert found({"train.py": script}) == (launcher, "train.py", line)


# (the files, entry first; where the launch is)
FOLLOWED = [
    (
        {"run.sh": "bash scripts/launch.sh", "scripts/launch.sh": "\n\ntorchrun t.py"},
        ("torchrun", "scripts/launch.sh", 3),
    ),
    ({"run.sh": "sh x.sh", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    ({"run.sh": "bash -x -e x.sh a b", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    ({"run.sh": "source x.sh", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    ({"run.sh": ". ./x.sh", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    ({"run.sh": "./x.sh", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    ({"run.sh": "x.sh --flag", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    ({"run.sh": "exec ./start", "start": "#!/bin/bash\ntorchrun t.py"}, ("torchrun", "start", 2)),
    ({"run.sh": "./start", "start": "#!/usr/bin/env bash\nmpirun x"}, ("mpirun", "start", 2)),
    (
        {"run.sh": "./go", "go": "#!/usr/bin/env python3\n" + SPAWN},
        ("torch.multiprocessing.spawn", "go", 6),
    ),
    (
        {"run.sh": "python train.py", "train.py": SPAWN},
        ("torch.multiprocessing.spawn", "train.py", 5),
    ),
    (
        {"run.sh": "python3 -u train.py --epochs 3", "train.py": SPAWN},
        ("torch.multiprocessing.spawn", "train.py", 5),
    ),
    (
        {"run.sh": "exec python3 train.py", "train.py": SPAWN},
        ("torch.multiprocessing.spawn", "train.py", 5),
    ),
    (
        {"run.sh": "python launcher", "launcher": SPAWN},
        ("torch.multiprocessing.spawn", "launcher", 5),
    ),
    (
        {"run.sh": "python -m pkg.launch", "pkg/launch.py": SPAWN},
        ("torch.multiprocessing.spawn", "pkg/launch.py", 5),
    ),
    (
        {"run.sh": "cd scripts && bash run.sh", "scripts/run.sh": "torchrun t.py"},
        ("torchrun", "scripts/run.sh", 1),
    ),
    (
        {"bin/start.sh": 'bash "$(dirname "$0")/inner.sh"', "bin/inner.sh": "torchrun t.py"},
        ("torchrun", "bin/inner.sh", 1),
    ),
    (
        {"bin/start.sh": "python train.py", "bin/train.py": SPAWN},
        ("torch.multiprocessing.spawn", "bin/train.py", 5),
    ),
    ({"run.sh": "bash /opt/ml/code/x.sh", "x.sh": "torchrun t.py"}, ("torchrun", "x.sh", 1)),
    (
        {"run.sh": 'bash "my dir/ä x.sh"', "my dir/ä x.sh": "torchrun t.py"},
        ("torchrun", "my dir/ä x.sh", 1),
    ),
    (
        {
            "train.py": "import subprocess\nsubprocess.run(['bash', 'launch.sh'])",
            "launch.sh": ("echo\ntorchrun t.py"),
        },
        ("torchrun", "launch.sh", 2),
    ),
    (
        {"train.py": "import os\nos.system('./launch.sh')", "launch.sh": "deepspeed t.py"},
        ("deepspeed", "launch.sh", 1),
    ),
    # the first launch as the entry point runs: the followed file's, before a later line's
    (
        {"run.sh": "python train.py\ntorchrun t.py", "train.py": SPAWN},
        ("torch.multiprocessing.spawn", "train.py", 5),
    ),
    ({"run.sh": "python t.py\ntorchrun t.py", "t.py": PLAIN}, ("torchrun", "run.sh", 2)),
    # cycles end, and what comes after them still counts
    ({"a.sh": "bash b.sh\ntorchrun t.py", "b.sh": "bash a.sh"}, ("torchrun", "a.sh", 2)),
    ({"a.sh": "bash b.sh", "b.sh": "bash a.sh\nbash b.sh\nmpirun x"}, ("mpirun", "b.sh", 3)),
    # four files deep
    (
        {
            "a.sh": "bash b.sh",
            "b.sh": "bash c.sh",
            "c.sh": "bash d.sh",
            "d.sh": "bash e.sh",
            "e.sh": "torchrun t.py",
        },
        ("torchrun", "e.sh", 1),
    ),
]


@pytest.mark.parametrize(("files", "expected"), FOLLOWED)
def test_a_launch_in_a_file_the_entry_point_runs_is_found_there(files, expected):
    assert found(files) == expected


NOT_SHELL = [
    "# torchrun --nproc_per_node 8 train.py\npython train.py",
    "echo torchrun train.py",
    'echo "now run: torchrun t.py"',
    "printf 'torchrun %s\\n' t.py",
    "cat <<EOF\ntorchrun t.py\nEOF",
    "cat <<-EOF\n\ttorchrun t.py\n\tEOF",
    "cat <<'EOF' > run2.sh\n$(torchrun t.py)\nEOF",
    'cat << "END"\nmpirun x\nEND\necho done',
    "X='torchrun t.py'",
    "export LAUNCHER=torchrun",
    "CMD=(torchrun t.py)",
    "accelerate config default",
    "accelerate env",
    "pip install torchrun",
    "which torchrun",
    "command -v torchrun",
    "type torchrun",
    "grep torchrun train.log",
    "tail -f torchrun.log",
    "ls /opt/conda/bin/torchrun",
    "alias t=torchrun",
    "torchrun --help",
    "python -m torch.distributed.run --version",
    "python train.py",
    "python -c 'print(1)'",
    "bash missing.sh",
    "./missing.sh && source gone.sh",
    "echo 'torchrun' \"deepspeed\" mpirun",
    "",
]


@pytest.mark.parametrize("script", NOT_SHELL)
def test_a_shell_script_that_only_mentions_a_launcher_launches_nothing(script):
    assert found({"run.sh": script, "train.py": PLAIN}) is None


NOT_PYTHON = [
    "import torch.multiprocessing as mp\nmp.set_sharing_strategy('file_system')",
    "import torch.multiprocessing as mp",
    "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=4)",
    "import multiprocessing\nwith multiprocessing.Pool(4) as p:\n    p.map(f, xs)",
    "import multiprocessing as mp\nmp.Process(target=f).start()",
    "import torch.multiprocessing as mp\nmp.Process(target=f).start()",
    "import torch.multiprocessing as mp\nctx = mp.get_context('spawn')\nq = ctx.Queue()",
    '"""Run with torchrun --nproc_per_node 8 train.py; mp.spawn(f) also works."""\n',
    "# import torch.multiprocessing as mp; mp.spawn(f)\n",
    "s = 'torchrun x.py'\nprint(s)",
    "import os\nCMD = 'torchrun x.py'\nprint(CMD)",
    "import torch.multiprocessing as mp\nlaunch = mp.spawn  # only a reference\n",
    "from torch.distributed.launcher.api import elastic_launch",
    "def spawn(f):\n    pass\n\nspawn(f)",
    "import subprocess\nsubprocess.run(['pip', 'install', 'torchrun'])",
    "import subprocess\nsubprocess.run(['echo', 'torchrun'])",
    "import os\nos.system('which torchrun')",
    "import subprocess\nsubprocess.run(cmd)",
    "import torch.distributed as dist\ndist.init_process_group('nccl')",
    "def f(:\n    import torch.multiprocessing as mp\n    mp.spawn(f)",
    "print('mp.spawn(f)')",
    "",
]


@pytest.mark.parametrize("script", NOT_PYTHON)
def test_a_python_script_that_only_mentions_a_launcher_launches_nothing(script):
    assert found({"train.py": script}) is None


@pytest.mark.parametrize(
    "files",
    [
        {"run.sh": "python train.py", "train.py": PLAIN},  # runs a file with no launcher
        {"run.sh": "python other.py", "train.py": SPAWN},  # runs a file the code lacks
        {"model.bin": bytes(range(256)) * 64},  # neither Python nor shell
        {"run": b"\x7fELF\x02\x01\x01" + bytes(200)},  # a binary without an extension
        {"notes.txt": "torchrun t.py"},
        {"run": "torchrun t.py"},  # no `#!`: nothing says it is a shell script
        {
            "a.sh": "bash b.sh",
            "b.sh": "bash c.sh",
            "c.sh": "bash d.sh",
            "d.sh": "bash e.sh",
            "e.sh": "bash f.sh",
            "f.sh": "torchrun t.py",
        },  # five files deep
    ],
)
def test_what_the_entry_point_does_not_run_does_not_count(files):
    assert found(files) is None


def test_an_entry_point_not_in_the_files_launches_nothing():
    assert find_launcher("train.py", {"other.py": SPAWN.encode()}) is None
    assert find_launcher("./run.sh", {"run.sh": b"torchrun t.py"}) == Finding(
        "torchrun", "run.sh", 1
    )


def test_the_finding_describes_itself_on_one_line_whatever_the_file_is_called():
    assert Finding("torchrun", "run.sh", 3).describe() == "run.sh line 3 runs torchrun"
    odd = find_launcher("a\nb\x1b.sh", {"a\nb\x1b.sh": b"torchrun t.py"})
    assert odd is not None and odd.describe() == "a\\nb\\x1b.sh line 1 runs torchrun"
    undecodable = Finding("mpirun", "caf\udce9.sh", 2).describe()
    assert undecodable == "caf\\xe9.sh line 2 runs mpirun"
    assert (
        Finding("deepspeed", "données/ä.sh", 1).describe() == "données/ä.sh line 1 runs deepspeed"
    )


MIB = 1024 * 1024
HOSTILE = {
    "a huge shell script": {"run.sh": b"echo 'a b' \"c\" $X > /dev/null\n" * (3 * MIB // 30)},
    "one huge shell line": {"run.sh": b"echo " + b"x" * (3 * MIB)},
    "a huge Python file": {"train.py": b"import os\n" + b"x = [1, 2]\n" * (3 * MIB // 11)},
    "a deep Python expression": {"train.py": b"import os\nx = a" + b" + a" * 200_000},
    "deep Python brackets": {"train.py": b"(" * 100_000 + b")" * 100_000},
    "a deep Python unary chain": {"train.py": b"-" * 1_000_000 + b"a"},
    "a long Python attribute chain": {"train.py": b"import os\nos" + b".a" * 100_000 + b"()"},
    "values doubling in Python": {
        "train.py": b"import os\n"
        + b"".join(b"a%d = a%d + a%d\n" % (i, i + 1, i + 1) for i in range(60))
        + b"a60 = 'x'\nos.system(a0)\n"
    },
    "NUL bytes in Python": {"train.py": b"import torch\x00\nmp.spawn(f)\n"},
    "NUL bytes in shell": {"run.sh": b"\x00\x00 echo\x00\ntorchrun t.py\n"},
    "non-UTF-8 shell": {"run.sh": b"echo \xff\xfe\xe9\ntorchrun t.py\n"},
    "non-UTF-8 Python": {"train.py": b"# caf\xe9\nimport torch.multiprocessing as mp\nmp.spawn(f)"},
    "Latin-1 Python": {"train.py": b"# -*- coding: latin-1 -*-\ns = '\xe9'\nimport os\n"},
    "an empty shell script": {"run.sh": b""},
    "an empty Python file": {"train.py": b""},
    "only a BOM": {"train.py": b"\xef\xbb\xbf"},
    "a lone carriage return": {"run.sh": b"echo a\rtorchrun t.py\r"},
    "unbalanced quotes": {"run.sh": b"echo 'a\n\"b\ntorchrun `x\n$(\n"},
    "a trailing backslash": {"run.sh": b"echo \\"},
    "nested substitutions": {"run.sh": b'echo "' + b"$(\n" * 5_000 + b'"'},
    "nested brackets": {"run.sh": b"(\n" * 5_000 + b")\n" * 5_000},
    "unpaired backquotes": {"run.sh": b'echo "' + b"`a \n" * 3_000 + b'"'},
    "here-documents never ended": {"run.sh": b"cat <<A <<B <<C\n" + b"x\n" * 10_000},
    "many here-documents": {"run.sh": b"cat <<E\nx\nE\n" * 3_000},
    "values doubling in shell": {"run.sh": b"X=ab\n" + b"X=$X$X$X$X\n" * 50 + b"$X\n"},
    "an eval of itself": {"run.sh": b"X='eval $X'\neval $X\n"},
    "hundreds of evals": {"run.sh": b"X=" + b"a" * 4000 + b"\n" + b"eval $X\n" * 500},
    "bash -c within bash -c": {"run.sh": b"bash -c " + b"'bash -c \"" * 500},
    "a cycle of two": {"a.sh": b"bash b.sh", "b.sh": b"bash a.sh"},
    "a file that runs itself": {"a.sh": b"bash a.sh\n. a.sh\n./a.sh\n"},
    "many files running each other": {
        **{f"{i}.sh": b"".join(b"bash %d.sh\n" % j for j in range(50)) for i in range(50)},
        **{f"{i}.sh": b"echo x\n" * 5000 + b"bash 0.sh\n" for i in range(50, 60)},
    },
    "odd names": {"\udcff\n.sh": b"bash '\xff\n.sh'\n", " ": b"#!/bin/sh\n. ' '"},
}


@pytest.mark.parametrize("files", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_input_gets_an_answer_not_an_exception_and_soon(files):
    entry = next(iter(files))
    # its own CPU time (not the wall clock, which a loaded machine stretches), far from what
    # the slowest of these takes on a busy 2-CPU machine (0.4 s): the bound rules out work
    # that grows with the input unchecked (a quadratic walk, an unbounded expansion)
    started = time.thread_time()
    finding = find_launcher(entry, files)
    assert time.thread_time() - started < 5.0
    assert finding is None or isinstance(finding, Finding)
    assert finding is None or isinstance(finding.describe(), str)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"run.sh": b"\x00\x00 echo\x00\ntorchrun t.py\n"}, ("torchrun", "run.sh", 2)),
        ({"run.sh": b"echo \xff\xfe\xe9\ntorchrun t.py\n"}, ("torchrun", "run.sh", 2)),
        (
            {"t.py": b"# caf\xe9\nimport torch.multiprocessing as mp\nmp.spawn(f)"},
            ("torch.multiprocessing.spawn", "t.py", 3),
        ),
        ({"run.sh": b"torchrun t.py\n" + b"echo x\n" * MIB}, ("torchrun", "run.sh", 1)),
        ({"run.sh": b"echo x\n" * MIB + b"torchrun t.py\n"}, None),  # past the cap: not read
        ({"run.sh": b"echo 'a\ntorchrun t.py\n"}, ("torchrun", "run.sh", 2)),  # the quote's line
    ],
)
def test_odd_bytes_still_read_as_far_as_they_go(files, expected):
    assert found(files) == expected


def test_names_the_shell_reads_as_bytes_match_the_files_they_name():
    files = {
        "é dir/run\n.sh": b"cd '\xc3\xa9 dir' && bash './\xff x.sh'",
        "é dir/\udcff x.sh": b"mpirun x",
    }
    finding = find_launcher("é dir/run\n.sh", files)
    assert finding == Finding("mpirun", "é dir/\udcff x.sh", 1)
    assert finding.describe() == "é dir/\\xff x.sh line 1 runs mpirun"


def test_a_python_file_past_its_cap_is_read_up_to_a_statement_there():
    big = SPAWN + "\n\ndef helper():\n    return 1\n" * 40_000  # about 1 MiB
    assert found({"train.py": big}) == ("torch.multiprocessing.spawn", "train.py", 5)
    assert found({"train.py": "x = 1\n" * 200_000 + SPAWN}) is None  # past the cap: not read
