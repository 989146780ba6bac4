"""The official E2B Python SDK (e2b, e2b-code-interpreter) against a real
aenv server: what the JS suites cover, compactly, on one server.

Run from the Makefile (`make test-e2e-python`), or:

    cd e2e/python && AENV_BIN_DIR=... AENV_BASE_ROOTFS=... \
      AENV_CODE_INTERPRETER_ROOTFS=... /usr/bin/python3 -m unittest -v
"""

import asyncio
import time
import unittest

import harness

SERVER = harness.Server()
e2b = ci = None  # the SDK's modules, once setUpModule found them


def setUpModule():
    global e2b, ci
    harness.load_sdk()
    import e2b as _e2b
    import e2b_code_interpreter as _ci

    e2b, ci = _e2b, _ci
    SERVER.start()


def tearDownModule():
    if getattr(SERVER, "proc", None) is None:
        return
    try:
        states = [e2b.SandboxState.RUNNING, e2b.SandboxState.PAUSED]
        leftover = e2b.Sandbox.list(query=e2b.SandboxQuery(state=states)).next_items()
        for info in leftover:
            e2b.Sandbox.kill(info.sandbox_id)
    finally:
        SERVER.stop()
    if leftover:
        raise AssertionError(f"tests left sandboxes behind: {[i.sandbox_id for i in leftover]}")


class Case(unittest.TestCase):
    def sandbox(self, **kw):
        """A sandbox killed after the test."""
        sbx = e2b.Sandbox.create(**kw)
        self.addCleanup(lambda: e2b.Sandbox.kill(sbx.sandbox_id))
        return sbx


class SandboxTest(Case):
    def test_create_list_info_kill(self):
        sbx = e2b.Sandbox.create(metadata={"suite": "python", "case": "lifecycle"}, timeout=120)
        info = sbx.get_info()
        self.assertEqual(info.sandbox_id, sbx.sandbox_id)
        self.assertEqual(info.template_id, "base")
        self.assertEqual(info.metadata.get("case"), "lifecycle")
        listed = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"case": "lifecycle"})).next_items()
        self.assertEqual([i.sandbox_id for i in listed], [sbx.sandbox_id])
        self.assertTrue(sbx.is_running())
        self.assertTrue(sbx.kill())
        self.assertFalse(e2b.Sandbox.kill(sbx.sandbox_id), "a second kill finds no sandbox")
        with self.assertRaises(e2b.NotFoundException):
            e2b.Sandbox.connect(sbx.sandbox_id)


class CommandsTest(Case):
    def test_run_background_stdin(self):
        sbx = self.sandbox()
        r = sbx.commands.run("echo out; echo err >&2; whoami")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, "out\nuser\n", "err\n"))
        with self.assertRaises(e2b.CommandExitException) as cm:
            sbx.commands.run("exit 3")
        self.assertEqual(cm.exception.exit_code, 3)
        seen = []
        # The sync SDK's background handle calls back while it is waited on.
        h = sbx.commands.run("sleep 0.5; echo later", background=True)
        self.assertEqual(h.wait(on_stdout=seen.append).stdout, "later\n")
        self.assertEqual(seen, ["later\n"])
        cat = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(cat.pid, "fed through stdin\n")
        sbx.commands.close_stdin(cat.pid)
        self.assertEqual(cat.wait().stdout, "fed through stdin\n")


class FilesTest(Case):
    def test_write_read_list_watch(self):
        sbx = self.sandbox()
        sbx.files.make_dir("/home/user/w")
        watch = sbx.files.watch_dir("/home/user/w")
        sbx.files.write("/home/user/w/a.txt", "alpha")
        self.assertEqual(sbx.files.read("/home/user/w/a.txt"), "alpha")
        self.assertEqual(bytes(sbx.files.read("/home/user/w/a.txt", format="bytes")), b"alpha")
        self.assertEqual([e.name for e in sbx.files.list("/home/user/w")], ["a.txt"])
        events = harness.wait_for(lambda: [e for e in watch.get_new_events() if e.name == "a.txt"], what="a watch event for a.txt")
        self.assertIn(events[0].type, (e2b.FilesystemEventType.CREATE, e2b.FilesystemEventType.WRITE))
        watch.stop()
        self.assertFalse(sbx.files.exists("/home/user/w/nope"))


class StateTest(Case):
    def test_pause_connect(self):
        sbx = self.sandbox()
        sbx.files.write("/home/user/kept", "through the pause")
        sbx.commands.run("sleep 600", background=True)
        self.assertTrue(sbx.pause())
        self.assertEqual(e2b.Sandbox.get_info(sbx.sandbox_id).state, e2b.SandboxState.PAUSED)
        back = e2b.Sandbox.connect(sbx.sandbox_id)
        self.assertEqual(back.get_info().state, e2b.SandboxState.RUNNING)
        self.assertEqual(back.files.read("/home/user/kept"), "through the pause")
        self.assertIn("sleep 600", back.commands.run("ps -eo args").stdout, "the process lived through the pause")

    def test_snapshot(self):
        sbx = self.sandbox()
        sbx.files.write("/home/user/snapped", "in the snapshot")
        snap = sbx.create_snapshot()
        self.assertTrue(snap.snapshot_id)
        self.addCleanup(lambda: e2b.Sandbox.delete_snapshot(snap.snapshot_id))
        self.assertIn(snap.snapshot_id, [s.snapshot_id for s in e2b.Sandbox.list_snapshots().next_items()])
        child = self.sandbox(template=snap.snapshot_id)
        self.assertEqual(child.files.read("/home/user/snapped"), "in the snapshot")
        self.assertTrue(sbx.is_running(), "the snapshotted sandbox runs on")

    def test_fork(self):
        parent = self.sandbox()
        parent.files.write("/home/user/inherited", "from the parent")
        kids = parent.fork(count=2, timeout=120)
        self.assertEqual(len(kids), 2)
        for k in kids:
            self.assertNotIsInstance(k, Exception)
            self.addCleanup(lambda k=k: e2b.Sandbox.kill(k.sandbox_id))
        self.assertEqual(len({k.sandbox_id for k in kids} | {parent.sandbox_id}), 3)
        for k in kids:
            self.assertEqual(k.files.read("/home/user/inherited"), "from the parent")
        kids[0].files.write("/home/user/inherited", "changed in one child")
        self.assertEqual(kids[1].files.read("/home/user/inherited"), "from the parent")
        self.assertEqual(parent.files.read("/home/user/inherited"), "from the parent")
        self.assertTrue(parent.is_running())


class NetworkTest(Case):
    def test_user_port_and_rules(self):
        sbx = self.sandbox()
        sbx.files.write("/home/user/www/index.html", "served from the sandbox")
        sbx.commands.run("cd /home/user/www && python3 -m http.server 8080", background=True)
        import httpx

        host = sbx.get_host(8080)
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8080"}

        def fetch():
            r = httpx.get(SERVER.url + "/index.html", headers=headers)
            return r.status_code == 200 and r.text

        body = harness.wait_for(fetch, what=f"the server on {host}")
        self.assertEqual(body, "served from the sandbox")
        sbx.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["10.1.2.3"]})
        net = sbx.get_info().network or {}
        self.assertEqual((net.get("deny_out"), net.get("allow_out")), (["0.0.0.0/0"], ["10.1.2.3"]), net)
        sbx.update_network({})
        net = sbx.get_info().network or {}
        self.assertFalse(net.get("deny_out") or net.get("allow_out"), f"an empty update clears the rules: {net}")


class HistoryTest(Case):
    def test_metrics_and_logs(self):
        sbx = self.sandbox()
        sbx.commands.run("echo logged")
        points = harness.wait_for(sbx.get_metrics, timeout=30, what="a metrics sample")
        self.assertGreaterEqual(points[0].cpu_count, 1)
        self.assertGreater(points[0].mem_total, 0)
        from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id_logs, get_v_2_sandboxes_sandbox_id_logs
        from e2b.api.client.client import AuthenticatedClient

        api = AuthenticatedClient(base_url=SERVER.url, token=SERVER.api_key, prefix="", auth_header_name="X-API-Key")
        v1 = get_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=api, start=0, limit=50)
        self.assertEqual(v1.status_code, 200, v1.content)
        self.assertTrue(v1.parsed.logs and len(v1.parsed.logs) == len(v1.parsed.log_entries), v1.content)
        v2 = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=api, limit=50)
        self.assertEqual(v2.status_code, 200, v2.content)
        self.assertTrue(v2.parsed.logs, v2.content)


class InterpreterTest(unittest.TestCase):
    def test_state_png_error_contexts(self):
        sbx = ci.Sandbox.create()
        self.addCleanup(sbx.kill)
        self.assertEqual(sbx.get_info().template_id, "code-interpreter-v1")
        sbx.run_code("x = 41")
        self.assertEqual(sbx.run_code("x + 1").text, "42")
        out = []
        sbx.run_code("print('streamed')", on_stdout=lambda m: out.append(m.line))
        self.assertEqual(out, ["streamed\n"])
        png = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        self.assertTrue(any(r.png for r in png.results), f"no PNG in {png.results}")
        err = sbx.run_code("1 / 0").error
        self.assertEqual(err.name, "ZeroDivisionError")
        self.assertIn("ZeroDivisionError", err.traceback)
        other = sbx.create_code_context()
        self.assertIn(other.id, [c.id for c in sbx.list_code_contexts()])
        self.assertEqual(sbx.run_code("x = 'own'; x", context=other).text, "'own'")
        self.assertEqual(sbx.run_code("x").text, "41", "contexts keep their own state")
        sbx.remove_code_context(other)
        self.assertNotIn(other.id, [c.id for c in sbx.list_code_contexts()])


class AsyncTest(unittest.IsolatedAsyncioTestCase):
    async def test_async_sandbox(self):
        sbx = await e2b.AsyncSandbox.create(metadata={"case": "async"})
        try:
            r = await sbx.commands.run("echo async")
            self.assertEqual(r.stdout, "async\n")
            await sbx.files.write("/home/user/a", "written async")
            self.assertEqual(await sbx.files.read("/home/user/a"), "written async")
            self.assertTrue(await sbx.is_running())
            runs = await asyncio.gather(*(sbx.commands.run(f"echo {i}") for i in range(4)))
            self.assertEqual([r.stdout for r in runs], [f"{i}\n" for i in range(4)])
            isbx = await ci.AsyncSandbox.create()
            try:
                self.assertEqual((await isbx.run_code("6 * 7")).text, "42")
            finally:
                await isbx.kill()
        finally:
            self.assertTrue(await sbx.kill())


if __name__ == "__main__":
    unittest.main()
