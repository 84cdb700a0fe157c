"""Issue 36: a resident server answers every command as the command would have answered in
its own process: the same --json (measured times aside), the same table at the caller's width;
its socket is the user's alone (0600); a stale socket, another user's server and a killed server
cost a line and the in-process run; Ctrl-C in the client cancels the request, not the server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace import client, serving
from fptrace.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
P = "The cat sat on the"


def env_for(sock: Path, **extra: str) -> dict:
    env = dict(os.environ, **{serving.SOCKET_ENV: str(sock), "COLUMNS": "120", "TERM": "dumb"})
    env.pop(serving.SWITCH_ENV, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def fptrace(args: list[str], sock: Path, cwd: Path | None = None, **extra: str):
    return subprocess.run([sys.executable, "-m", "fptrace", *args], env=env_for(sock, **extra),
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def stop_server(sock: Path) -> None:
    """Stop the server at `sock`, by its process id where asking is not enough."""
    try:
        answer = serving.request({"op": "status"}, str(sock))
    except serving.Refused:  # not a socket: no server there to stop
        return
    if answer is None:
        return
    serving.request({"op": "stop"}, str(sock))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(answer["pid"], 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(answer["pid"], signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sock = tmp_path_factory.mktemp("serve") / "run" / "s.sock"
    done = fptrace(["serve", "--idle-timeout", "600"], sock)
    assert done.returncode == 0, done.stderr
    assert "listening at" in done.stderr
    yield sock
    stop_server(sock)


def without_times(value):
    """A JSON value with its measured times and rates (keys ending in `seconds`, `_per_s`) left
    out."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items()
                if not k.endswith(("seconds", "_per_s"))}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


@pytest.mark.system
def test_the_socket_is_the_users_alone(server):
    assert os.stat(server).st_mode & 0o777 == 0o600
    assert os.stat(server.parent).st_mode & 0o777 == 0o700
    assert serving.owner_problem(str(server)) is None


@pytest.mark.system
def test_status_names_the_server_and_its_models(server):
    done = fptrace(["serve", "--status", "--json"], server)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["socket"] == str(server)
    os.kill(answer["pid"], 0)  # it is a process of ours
    assert answer["rss"] > 0


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    from fptrace.commands.features.examples import write_seeded

    folder = tmp_path_factory.mktemp("work")
    (folder / "prompts.txt").write_text("The cat sat\nA dog ran to the\nOne two three\n")
    write_seeded(str(folder / "sae"), 32, 64)
    (folder / "ids.txt").write_text("464\n3797\n3332\n")  # --ids-file, read from the caller's folder
    return folder


def commands(tiny: str) -> list[list[str]]:
    """Every command that loads a model, as a --json call on a tiny GPT-2."""
    m = ["-m", tiny]
    return [
        ["run", P, *m, "--json"],
        ["run", P, *m, "--json", "--all-positions", "-k", "3"],
        ["explain", P, *m, "--layer", "1", "--json"],
        ["attribute", P, *m, "--json"],
        ["attribute", P, *m, "--qk", "1.0", "--json"],
        ["diff", P, *m, "--dtype-b", "bfloat16", "--json"],
        ["patch", P, *m, "--noise", " cat", "--json"],
        ["steer", P, *m, "--token", " dog", "--layer", "1", "--scale", "0,1", "-n", "2",
         "--json"],
        ["ablate", P, *m, "--head", "1.0", "--json"],
        ["stats", "prompts.txt", *m, "--json"],
        ["generate", P, *m, "-n", "3", "--json"],
        ["generate", P, *m, "-n", "3", "--temperature", "0.8", "--seed", "3", "--json"],
        ["shapes", *m, P, "--json"],
        ["features", P, *m, "--sae", "sae", "--json"],
        ["run", "--ids", "464,3797,3332", *m, "--json"],
        ["run", "--ids-file", "ids.txt", *m, "--json"],
        ["tokens", P, *m, "--json"],
        ["tokens", "--ids", "464,269,265", *m, "--json"],
    ]


def in_process(args: list[str], cwd: Path, columns: str = "120") -> tuple[int, str]:
    """The command run in this process, in `cwd`, at `columns`: (exit code, stdout)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(app, args, env={"COLUMNS": columns, "TERM": "dumb"})
    finally:
        os.chdir(old)
    return r.exit_code, r.stdout


@pytest.mark.system
@pytest.mark.slow
def test_every_command_answers_the_same_through_the_server(server, work):
    tiny = tiny_gpt2()
    for args in commands(tiny):
        remote = fptrace(args, server, cwd=work)
        code, here = in_process(args, work)
        assert remote.returncode == code == 0, (args, remote.stderr[-600:])
        assert without_times(json.loads(remote.stdout)) == without_times(json.loads(here)), args
    held = serving.request({"op": "status"}, str(server))["held"]
    assert any(m["uses"] > 1 for m in held)  # answered from a model loaded once


@pytest.mark.system
def test_the_table_fits_the_callers_width(server, work):
    tiny = tiny_gpt2()
    for columns in ("80", "150"):
        args = ["run", P, "-m", tiny, "-k", "3"]
        remote = fptrace(args, server, cwd=work, COLUMNS=columns)
        code, here = in_process(args, work, columns)
        assert remote.returncode == code == 0, remote.stderr
        width = max(len(line) for line in remote.stdout.splitlines())
        assert width <= int(columns)
        assert without_tokenizer_time(remote.stdout) == without_tokenizer_time(here)


TOKENIZER_TIME = re.compile(r"takes [0-9.,]+ ?(µs|ms|s)\b")  # 50 µs; 3.5 ms; 4.3 ms when loaded


def without_tokenizer_time(text: str) -> list[str]:
    """A table's lines with the tokenizer's measured time left out: the paragraph that says it
    is joined and its time replaced (3.5 ms or 350 µs wraps it at another word), every other
    line kept as printed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("the tokenizer is a lookup"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("╭─ Shape flow"))
    said = TOKENIZER_TIME.sub("takes <time>", " ".join(lines[start:end]))
    return lines[:start] + [" ".join(said.split())] + lines[end:]


def page_without_times(text: str) -> str:
    """A report page with its measured times left out: the JSON it embeds (as data: links,
    base64) compared without them, and the tokenizer's time in the sentence that says it."""
    import base64

    def decoded(m: re.Match) -> str:
        doc = json.loads(base64.b64decode(m.group(1)))
        return json.dumps(without_times(doc), sort_keys=True)

    text = re.sub(r"data:application/json;base64,([A-Za-z0-9+/=]+)", decoded, text)
    text = re.sub(r'"[a-z_]*seconds": ?[-+0-9.e]+', '"<seconds>"', text)
    return TOKENIZER_TIME.sub("takes <time>", text)


@pytest.mark.system
def test_report_writes_the_same_page(server, work):
    tiny = tiny_gpt2()
    for name, env in (("remote.html", {}), ("here.html", {serving.SWITCH_ENV: "off"})):
        done = fptrace(["report", P, "-m", tiny, "--out", name], server, cwd=work, **env)
        assert done.returncode == 0, done.stderr
    remote, here = (page_without_times((work / n).read_text(encoding="utf-8"))
                    for n in ("remote.html", "here.html"))
    assert remote == here and "data:application/json" not in remote


@pytest.mark.system
def test_batch_writes_the_same_records(server, work):
    tiny = tiny_gpt2()
    for name, env in (("remote.jsonl", {}), ("here.jsonl", {serving.SWITCH_ENV: "off"})):
        done = fptrace(["batch", "prompts.txt", "-m", tiny, "--out", name], server, cwd=work,
                       **env)
        assert done.returncode == 0, done.stderr
    remote, here = ([without_times(json.loads(x)) for x in (work / name).read_text().splitlines()]
                    for name in ("remote.jsonl", "here.jsonl"))
    assert remote == here and len(remote) >= 3


@pytest.mark.system
def test_bad_input_is_the_same_line_and_code(server, work):
    remote = fptrace(["run", P, "--top-k", "0"], server, cwd=work)
    here = fptrace(["run", P, "--top-k", "0"], server, cwd=work, **{serving.SWITCH_ENV: "off"})
    assert remote.returncode == here.returncode == 2
    assert remote.stderr == here.stderr and remote.stderr.count("\n") == 1


@pytest.mark.system
@pytest.mark.parametrize("args", [["run", "--ids", "5,50257"], ["tokens", "--ids", "\u0663"],
                                  ["run", P, "--ids", "5"]])
def test_bad_ids_are_the_same_line_and_code(server, work, args):
    args = [*args, "-m", tiny_gpt2()]
    remote = fptrace(args, server, cwd=work)
    here = fptrace(args, server, cwd=work, **{serving.SWITCH_ENV: "off"})
    assert remote.returncode == here.returncode == 2
    assert remote.stderr.splitlines()[-1] == here.stderr.splitlines()[-1]
    assert remote.stderr.splitlines()[-1].startswith("fptrace: error: ")


@pytest.mark.system
def test_tokens_answers_at_once_through_the_server(server, work):
    """With a server, `tokens` costs the client's start and the tokenizer's work: no import of
    transformers or torch, no weights (measured: about 0.3 s on an idle machine)."""
    args = ["tokens", P, "-m", tiny_gpt2(), "--json"]
    fptrace(args, server, cwd=work)  # the server's first tokenizer of this folder
    t0 = time.perf_counter()
    done = fptrace(args, server, cwd=work)
    seconds = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"][0]["id"] == 464
    assert seconds < 10, seconds  # a shared machine; the number is in the report


@pytest.mark.system
def test_ctrl_c_cancels_the_request_not_the_server(server, work):
    tiny = tiny_gpt2()
    (work / "many.txt").write_text("The cat sat on the mat\n" * 50000)
    p = subprocess.Popen([sys.executable, "-m", "fptrace", "stats", "many.txt", "-m", tiny,
                          "--json"], env=env_for(server), cwd=work, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the server runs it
        answer = serving.request({"op": "status"}, str(server))
        if answer and answer["busy"]:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("fptrace: error: interrupted")
    assert "Traceback" not in err
    after = fptrace(["run", P, "-m", tiny, "--json"], server, cwd=work)
    assert after.returncode == 0 and json.loads(after.stdout)["top_k"]
    assert serving.request({"op": "status"}, str(server))["busy"] is False


@pytest.mark.system
def test_a_stale_socket_is_one_line_and_the_run_here(tmp_path):
    sock = tmp_path / "run" / "s.sock"
    sock.parent.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()  # the file stays, nobody listens: what a killed server leaves
    done = fptrace(["schema"], sock)
    assert done.returncode == 0 and json.loads(done.stdout)
    assert done.stderr.count("\n") == 1 and "stale socket" in done.stderr
    assert not sock.exists()


@pytest.mark.system
def test_a_killed_server_costs_the_in_process_run(tmp_path):
    sock = tmp_path / "run" / "s.sock"
    done = fptrace(["serve"], sock)
    assert done.returncode == 0, done.stderr
    pid = serving.request({"op": "status"}, str(sock))["pid"]
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    done = fptrace(["models", "--json"], sock)
    assert done.returncode == 0 and json.loads(done.stdout)
    assert done.stderr.count("\n") == 1 and "stale" in done.stderr


def test_another_users_socket_is_not_used(tmp_path, monkeypatch, capsys):
    sock = tmp_path / "run" / "s.sock"
    sock.parent.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    try:
        s.listen(1)
        monkeypatch.setattr(os, "getuid", lambda: os.stat(sock).st_uid + 1)
        with pytest.raises(serving.Refused, match="not to this user"):
            serving.connect(str(sock))
        assert client.run_remote(["schema"], str(sock)) is None
    finally:
        s.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not to this user" in err and "running here" in err


def test_a_folder_open_to_others_is_not_trusted(tmp_path):
    sock = tmp_path / "run" / "s.sock"
    sock.parent.mkdir(mode=0o700)
    sock.write_text("")
    os.chmod(sock.parent, 0o777)
    assert "open to other users" in serving.owner_problem(str(sock))


@pytest.mark.system
def test_a_second_server_is_refused(server):
    done = fptrace(["serve"], server)
    assert done.returncode == 1 and "already listens" in done.stderr
    assert done.stderr.count("\n") == 1


def test_what_runs_here_always():
    assert not client.wants_server(["run", "x", "--tp", "2"])
    assert not client.wants_server(["batch", "p.txt", "--ray"])
    assert client.wants_server(["run", "x"])


def test_a_request_that_changes_a_held_model_drops_it():
    import torch

    from fptrace.models import resident
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), device="cpu")
    resident.hold(1 << 40)
    try:
        for change, undo in (
                (lambda: lm.model.transformer.h[0].register_forward_hook(lambda *a: None), None),
                (lambda: lm.model.transformer.h[0].mlp.c_fc.weight.mul_(1.0), None),
                (lambda: lm.model.train(), lambda: lm.model.eval())):
            resident.keep(("k",), lm, 0.0)
            assert resident.sweep() == []
            with torch.no_grad():
                handle = change()
            assert resident.sweep() == [lm.name] and resident.loaded(("k",)) is None
            if hasattr(handle, "remove"):
                handle.remove()
            if undo:
                undo()
    finally:
        resident.release()
        resident.hold(None)


@pytest.mark.system
def test_the_client_imports_no_heavy_library():
    code = ("import sys, fptrace.client; heavy = [m for m in ('torch', 'transformers', 'typer', "
            "'rich', 'numpy') if m in sys.modules]; print(','.join(heavy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout


@pytest.mark.system
def test_commands_import_only_what_they_use():
    """Nothing imports torchao, Ray, matplotlib, Textual or playwright unless the command uses
    it: --help, and a run without --plot or --quantize."""
    tiny = tiny_gpt2()
    code = ("import sys\nfrom fptrace.cli.main import answer\n"
            "rc = answer(sys.argv[1:])\n"
            "heavy = [m for m in ('torchao', 'ray', 'matplotlib', 'textual', 'playwright') "
            "if m in sys.modules]\nprint('HEAVY', ','.join(heavy))\n")
    for args in (["--help"], ["run", P, "-m", tiny, "--json"]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0, done.stderr[-500:]
        assert done.stdout.strip().splitlines()[-1] == "HEAVY", (args, done.stdout[-200:])


@pytest.mark.system
def test_keep_warm_starts_a_server_on_first_use(tmp_path):
    sock = tmp_path / "run" / "s.sock"
    try:
        first = fptrace(["schema", "--keep-warm"], sock)
        assert first.returncode == 0 and json.loads(first.stdout), first.stderr
        answer = serving.request({"op": "status"}, str(sock))
        assert answer is not None and answer["served"] == 1  # it answered the first call
        second = fptrace(["schema"], sock, **{"FPTRACE_KEEP_WARM": "1"})
        assert second.stdout == first.stdout
        assert serving.request({"op": "status"}, str(sock))["served"] == 2
    finally:
        stop_server(sock)


@pytest.mark.system
def test_stop_ends_the_server_and_removes_its_socket(tmp_path):
    sock = tmp_path / "run" / "s.sock"
    assert fptrace(["serve"], sock).returncode == 0
    pid = serving.request({"op": "status"}, str(sock))["pid"]
    t0 = time.monotonic()
    done = fptrace(["serve", "--stop"], sock)
    assert done.returncode == 0 and f"pid {pid}" in done.stderr
    assert not sock.exists() and time.monotonic() - t0 < 20
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the server did not end")
    assert fptrace(["serve", "--status"], sock).returncode == 1


@pytest.mark.system
def test_the_server_computes_with_the_callers_threads(server, work):
    """OMP_NUM_THREADS of the caller is what the command runs with (a sum over other threads
    rounds otherwise in its last digits). The suite's processes compute on one thread, so a
    caller's two is the case that differs from the server's own."""
    tiny = tiny_gpt2()
    remote = fptrace(["run", P, "-m", tiny, "--json"], server, cwd=work, OMP_NUM_THREADS="2")
    here = subprocess.run([sys.executable, "-m", "fptrace", "run", P, "-m", tiny, "--json"],
                          env=env_for(server, OMP_NUM_THREADS="2", **{serving.SWITCH_ENV: "off"}),
                          cwd=work, capture_output=True, text=True, timeout=600)
    assert remote.returncode == here.returncode == 0
    assert without_times(json.loads(remote.stdout)) == without_times(json.loads(here.stdout))


@pytest.mark.system
def test_a_command_left_to_the_caller_gets_ctrl_c_back(server):
    """The client listens for Ctrl-C while the server answers; where the server leaves the
    command to its caller (the TUI), the handler it replaced is back before the command runs
    here, so the first Ctrl-C interrupts it."""
    def mine(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, mine)
    try:
        assert client.run_remote(["tui", "--help"], str(server)) is None
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


def one_line(text: str) -> bool:
    return text.count("\n") == 1 and text.endswith("\n")


@pytest.mark.system
def test_a_folder_the_user_named_is_never_changed_and_refused_when_open(tmp_path):
    """FPTRACE_SOCKET in a folder open to others (a home of mode 755, /var/tmp): the server
    refused it where the client would, and never chmods it (it once made /var/tmp 0700)."""
    pub = tmp_path / "pub"
    pub.mkdir()
    os.chmod(pub, 0o755)
    sock = pub / "serve.sock"
    try:
        for args in (["serve"], ["serve", "--foreground"]):
            done = fptrace(args, sock)
            assert done.returncode == 2 and one_line(done.stderr), done.stderr
            assert f"{pub} is open to other users (mode 755)" in done.stderr
            assert os.stat(pub).st_mode & 0o777 == 0o755 and not sock.exists()
    finally:
        os.chmod(pub, 0o700)
        stop_server(sock)


@pytest.mark.system
def test_a_folder_through_a_symlink_is_judged_alike_by_server_and_client(tmp_path):
    """The one check, on the folder a symlink leads to: the client used to judge the link
    itself (mode 777) and refuse the server that had just started there."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    sock = link / "s.sock"
    try:
        assert fptrace(["serve"], sock).returncode == 0
        done = fptrace(["schema"], sock)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert serving.request({"op": "status"}, str(sock))["served"] == 1
        os.chmod(real, 0o750)  # now open to the group: neither side uses it
        done = fptrace(["schema"], sock)
        assert done.returncode == 0 and json.loads(done.stdout) and one_line(done.stderr)
        assert "open to other users (mode 750)" in done.stderr and "running here" in done.stderr
        with pytest.raises(serving.Refused):
            serving.request({"op": "status"}, str(sock))
        assert real.stat().st_mode & 0o777 == 0o750
    finally:
        os.chmod(real, 0o700)
        stop_server(sock)


@pytest.mark.system
def test_what_is_not_a_socket_is_never_removed(tmp_path):
    """A file or a folder at FPTRACE_SOCKET: refused in one line, kept, never called a stale
    socket (the clean-up once deleted any file that refused a connection, even for --status)."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    sock = folder / "s.sock"
    sock.write_text("my notes\n")
    try:
        line = f"{sock} is not a socket (a regular file); not removed"
        for args in (["serve", "--status"], ["serve", "--stop"], ["serve"],
                     ["serve", "--foreground"]):
            done = fptrace(args, sock)
            assert done.returncode == 2 and done.stderr == f"fptrace: error: {line}\n", args
        done = fptrace(["schema"], sock)
        assert done.returncode == 0 and json.loads(done.stdout)
        assert done.stderr == f"fptrace: {line}; running here\n"
        assert sock.read_text() == "my notes\n"
        sock.unlink()
        sock.mkdir()
        for args in (["schema"], ["serve"], ["serve", "--status"]):
            done = fptrace(args, sock)
            assert one_line(done.stderr) and "stale" not in done.stderr, (args, done.stderr)
            assert "is not a socket (a folder); not removed" in done.stderr
        assert sock.is_dir()
    finally:
        stop_server(sock)


@pytest.mark.system
@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
def test_a_server_that_cannot_start_says_why_in_one_line(tmp_path, foreground):
    """A socket path too long for a Unix socket, one that is a folder, an idle timeout past
    any clock: one line, exit 2 (they were `internal error`, or a server that died later)."""
    deep = tmp_path / ("x" * 100) / "s.sock"
    folder = tmp_path / "run" / "s.sock"
    folder.mkdir(parents=True)
    os.chmod(folder.parent, 0o700)
    cases = [(deep, [], "holds at most 107"),
             (folder, [], "is not a socket (a folder)"),
             (tmp_path / "ok" / "s.sock", ["--idle-timeout", "99999999999999999999"],
              "--idle-timeout")]
    for sock, extra, said in cases:
        try:
            done = fptrace(["serve", *(["--foreground"] if foreground else []), *extra], sock)
            assert done.returncode == 2 and one_line(done.stderr), (sock, done.stderr)
            assert said in done.stderr and "internal error" not in done.stderr
        finally:
            if len(os.fsencode(str(sock))) < 108:
                stop_server(sock)


@pytest.mark.system
def test_status_and_stop_are_answered_while_a_request_runs(tmp_path):
    """`serve --status` and `serve --stop` are not queued behind a running command (they once
    waited 12 minutes): stop interrupts it, and its client gets one line and 130."""
    tiny = tiny_gpt2()
    sock = tmp_path / "run" / "s.sock"
    (tmp_path / "many.txt").write_text("The cat sat on the mat\n" * 50000)
    assert fptrace(["serve"], sock).returncode == 0
    pid = serving.request({"op": "status"}, str(sock))["pid"]
    p = subprocess.Popen([sys.executable, "-m", "fptrace", "stats", "many.txt", "-m", tiny,
                          "--json"], env=env_for(sock), cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the server runs it
            answer = serving.request({"op": "status"}, str(sock))
            if answer and answer["busy"]:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        cmd = [sys.executable, "-m", "fptrace", "serve"]
        status = subprocess.run([*cmd, "--status"], env=env_for(sock), capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0 and "one running" in status.stdout, status.stderr
        t0 = time.monotonic()
        stop = subprocess.run([*cmd, "--stop"], env=env_for(sock), capture_output=True,
                              text=True, timeout=60)
        assert stop.returncode == 0 and stop.stderr == f"stopped the server (pid {pid})\n"
        _, err = p.communicate(timeout=60)
        assert time.monotonic() - t0 < 30 and not sock.exists()
        assert p.returncode == 130, err
        errors = [line for line in err.splitlines() if "error" in line]
        assert len(errors) == 1 and errors[0].startswith(
            "fptrace: error: interrupted (the server was stopped)"), err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        stop_server(sock)


@pytest.mark.system
def test_a_removed_working_folder_is_one_line(server, tmp_path):
    """The client's working folder removed before it runs: one line, exit 2, through the
    server (a traceback) and here (exit 70) alike."""
    tiny = tiny_gpt2()
    # The interpreter starts in the folder and removes it before fptrace runs: Python's own
    # start-up cannot run in a removed folder when PYTHONPATH holds a relative entry (CI's does).
    script = ("import os, runpy, sys; os.rmdir(os.getcwd()); sys.argv[0] = 'fptrace'; "
              "runpy.run_module('fptrace', run_name='__main__', alter_sys=True)")
    for extra in ({}, {serving.SWITCH_ENV: "off"}):
        gone = tmp_path / "gone"
        gone.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", script, "run", P, "-m", tiny], cwd=gone,
            env=env_for(server, **extra), capture_output=True, text=True, timeout=300)
        assert not gone.exists()
        assert done.returncode == 2, done.stderr
        assert done.stderr == f"fptrace: error: {serving.GONE_FOLDER}\n", extra


@pytest.mark.system
def test_a_working_folder_removed_before_the_server_runs_the_command(server, tmp_path):
    """The folder gone between the client's call and the server's turn: the line, exit 2."""
    import struct

    conn = serving.connect(str(server))
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    header = {"op": "command", "argv": ["schema"], "cwd": str(tmp_path / "gone"),
              "env": dict(os.environ), "umask": 0o022}
    try:
        serving.send_header(conn, header, [null, w_out, w_err])
        for fd in (null, w_out, w_err):
            os.close(fd)
        assert serving.read_exact(conn, 1) == serving.STARTED
        assert serving.read_exact(conn, 1) == serving.DONE
        assert struct.unpack("!i", serving.read_exact(conn, 4))[0] == 2
        assert os.read(r_err, 4096).decode() == f"fptrace: error: {serving.GONE_FOLDER}\n"
    finally:
        conn.close()
        os.close(r_out)
        os.close(r_err)


@pytest.mark.system
def test_keep_warm_calls_at_once_share_one_server(tmp_path):
    """Two `--keep-warm` calls at once: the one whose server lost the race uses the winner's
    (it ran here, with a line that nested three `fptrace: error:`)."""
    sock = tmp_path / "run" / "s.sock"
    procs = []
    try:
        for i in range(2):  # into files: a pipe read one after the other would fill and block
            with open(tmp_path / f"out{i}", "w") as out, open(tmp_path / f"err{i}", "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "fptrace", "schema", "--keep-warm"],
                    env=env_for(sock), stdout=out, stderr=err))
        for i, p in enumerate(procs):
            assert p.wait(timeout=300) == 0
            assert json.loads((tmp_path / f"out{i}").read_text())
            assert (tmp_path / f"err{i}").read_text() == ""
        assert serving.request({"op": "status"}, str(sock))["served"] == 2
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop_server(sock)


@pytest.mark.system
@pytest.mark.parametrize("budget", ["0", "0.4B", "1.5B", "0KiB"])
def test_a_memory_budget_is_at_least_one_whole_byte(tmp_path, budget):
    sock = tmp_path / "run" / "s.sock"
    try:
        done = fptrace(["serve", "--memory-budget", budget], sock)
        assert done.returncode == 2 and one_line(done.stderr), done.stderr
        assert "at least one byte" in done.stderr and not sock.exists()
    finally:
        stop_server(sock)


def test_each_request_has_the_clients_hub_offline_switch(tmp_path):
    """huggingface_hub reads HF_HUB_OFFLINE once, at its import: the server sets it from each
    client's environment for its request, and back to its own after."""
    import huggingface_hub.constants as hub

    from fptrace.commands.serve import core

    own = hub.HF_HUB_OFFLINE
    fds = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
    try:
        for env, want in (({"HF_HUB_OFFLINE": "1"}, True), ({"HF_HUB_OFFLINE": "0"}, False),
                          ({}, False), ({"TRANSFORMERS_OFFLINE": "yes"}, True)):
            header = {"argv": ["schema"], "cwd": str(tmp_path), "env": env}
            req = core.Request(None, header, fds)  # type: ignore[arg-type]
            with core.as_client(req):
                seen = hub.HF_HUB_OFFLINE
            assert seen is want, env
            assert hub.HF_HUB_OFFLINE is own
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.system
def test_a_client_with_another_hub_cache_runs_here(server, monkeypatch):
    """HF_HOME and the other places huggingface_hub reads once, at its import: a client whose
    environment moves them runs its command in its own process, where they apply (the server
    would look in its own cache)."""
    monkeypatch.setenv("HF_HOME", "/nonexistent/elsewhere")
    assert client.run_remote(["models", "--json"], str(server)) is None


def test_the_socket_appears_only_once_it_listens(tmp_path, monkeypatch):
    """Bound under another name, renamed into place once it listens: a client that connected
    between bind and listen took a starting server's socket for a stale one and removed it
    (two `--keep-warm` calls at once then waited 300 s for a server nobody could reach)."""
    from fptrace.commands.serve import core

    path = tmp_path / "run" / "s.sock"
    seen = []
    listen = socket.socket.listen

    def spy(self, *args):
        seen.append(os.path.lexists(path))
        return listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", spy)
    sock, lock = core.listen(str(path))
    try:
        assert seen == [False] and serving.not_a_socket(str(path)) is None and path.exists()
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert sorted(os.listdir(path.parent)) == ["s.sock", "s.sock.lock"]
    finally:
        sock.close()
        lock.close()


@pytest.mark.system
def test_serve_itself_never_says_running_here(tmp_path):
    """`serve --status` by a stale socket: the server's own line, not the front door's
    "...; running here" before it (serve runs here always)."""
    sock = tmp_path / "run" / "s.sock"
    sock.parent.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    done = fptrace(["serve", "--status"], sock)
    assert done.returncode == 1 and done.stderr == f"no fptrace server is running (socket {sock})\n"


@pytest.mark.system
def test_a_swallowed_interrupt_is_sent_again_while_the_request_runs(monkeypatch):
    """A KeyboardInterrupt raised inside a weakref callback or a __del__ is printed and lost,
    and the cancelled command would run to its end (seen once here: a 50,000-line stats run
    cancelled by Ctrl-C went on). The server interrupts a cancelled request again while it
    still runs, and stops as soon as the request is let go: no repeat reaches the next one."""
    from fptrace import interrupt
    from fptrace.commands.serve import core

    sent: list[int] = []
    monkeypatch.setattr(core, "REPEAT", 0.01)
    monkeypatch.setattr(core, "TICK", 0.01)
    monkeypatch.setattr(core.signal, "pthread_kill", lambda tid, sig: sent.append(sig))
    server = core.Server(path="unused", idle=0, budget=0)
    req = core.Request(conn=None, header={}, fds=[], started=True)  # type: ignore[arg-type]
    server.current = req
    core.cancel(server, req)
    deadline = time.monotonic() + 10
    while len(sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent[:3] == [signal.SIGINT] * 3  # the cancel, then the repeats
    with req.lock:  # the request let go, as `answer` does
        server.current = None
    time.sleep(0.1)
    after = len(sent)
    time.sleep(0.1)
    assert len(sent) == after <= 1 + core.REPEATS
    # the handler raises again on a repeat (a second Ctrl-C of a user ends the process)
    monkeypatch.setitem(interrupt._state, "phase", "running")
    monkeypatch.setitem(interrupt._state, "seen", True)
    interrupt.again()
    with pytest.raises(KeyboardInterrupt):
        interrupt._on_sigint(signal.SIGINT, None)
    assert interrupt._state["again"] is False
    # a resident server holds back an interrupt that lands inside an import
    monkeypatch.setitem(interrupt._state, "seen", False)
    monkeypatch.setitem(interrupt._state, "defer", True)
    frame = sys._getframe()
    importing = type("Frame", (), {"f_code": type("Code", (), {
        "co_filename": "<frozen importlib._bootstrap>"})(), "f_back": frame})()
    interrupt._on_sigint(signal.SIGINT, importing)  # no raise
    assert interrupt.deferred() and not interrupt.seen()
    with pytest.raises(KeyboardInterrupt):
        interrupt._on_sigint(signal.SIGINT, frame)
    assert not interrupt.deferred() and interrupt.seen()
