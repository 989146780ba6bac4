# The Python side of an aenv code-interpreter kernel (kernel.go): IPython's
# shell, run in this process's main thread, driven over two pipes the
# interpreter hands it. Requests come on fd 3, one JSON object a line:
# {"id", "code", "silent"}. Events go out on fd 4, one JSON object a line:
# {"id", "type", "content"}, where type and content are those of the
# Jupyter messages an execution publishes (stream, display_data,
# execute_result, error, execute_reply, status), so that the interpreter
# reads them as it would a Jupyter kernel's. One "ready" event says the
# shell is up.
import io
import json
import os
import signal
import sys
import threading
import time


def main():
    requests = os.fdopen(3, 'r', encoding='utf-8')
    events = os.fdopen(4, 'w', encoding='utf-8')
    state = {'id': None, 'running': False, 'emitting': False, 'deferred': False}
    # Held while an event is written: a stream's flush timer writes too.
    lock = threading.RLock()
    main_thread = threading.main_thread()

    def emit(typ, content):
        main = threading.current_thread() is main_thread
        with lock:
            line = json.dumps({'id': state['id'], 'type': typ, 'content': content}, default=repr) + '\n'
            # An interrupt (delivered to the main thread only) waits until
            # the line is out whole (see interrupted).
            if main:
                state['emitting'] = True
            try:
                events.write(line)
                events.flush()
            finally:
                if main:
                    state['emitting'] = False
        if main and state['deferred']:
            state['deferred'] = False
            if state['running']:
                raise KeyboardInterrupt

    class Stream(io.TextIOBase):
        """sys.stdout or sys.stderr: lines go out as stream events, at
        most one event per batch interval (a loop that prints a line at a
        time would otherwise cost a write per line), a partial line when
        flushed or when the execution ends."""

        batch = 0.01

        def __init__(self, name):
            super().__init__()
            self.name = name
            self.pending = []
            self.last = 0.0
            self.timer = None

        @property
        def encoding(self):
            return 'utf-8'

        def writable(self):
            return True

        def isatty(self):
            return False

        def write(self, s):
            if not isinstance(s, str):
                raise TypeError('write() argument must be str, not %s' % type(s).__name__)
            if not s:
                return 0
            with lock:
                self.pending.append(s)
                if '\n' not in s:
                    return len(s)
                if time.monotonic() - self.last < self.batch:
                    if self.timer is None:
                        self.timer = threading.Timer(self.batch, self.flush)
                        self.timer.daemon = True
                        self.timer.start()
                    return len(s)
            self.flush()
            return len(s)

        def flush(self):
            with lock:
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                if not self.pending:
                    return
                text, self.pending = ''.join(self.pending), []
                self.last = time.monotonic()
                emit('stream', {'name': self.name, 'text': text})

    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Hook(DisplayHook):
        """The last expression's value: an execute_result."""

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            emit('execute_result', {'data': format_dict, 'metadata': md_dict or {},
                                    'execution_count': self.prompt_count})

    class Publisher(DisplayPublisher):
        """display() and figures: display_data."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            emit('display_data', {'data': data, 'metadata': metadata or {}})

        def clear_output(self, wait=False):
            emit('clear_output', {'wait': wait})

    class Shell(InteractiveShell):
        def _showtraceback(self, etype, evalue, stb):
            name = getattr(etype, '__name__', str(etype))
            emit('error', {'ename': name, 'evalue': str(evalue), 'traceback': stb})

        def enable_gui(self, gui=None):
            pass

    stdout, stderr = Stream('stdout'), Stream('stderr')
    sys.stdout, sys.stderr = stdout, stderr
    sys.stdin = open(os.devnull)
    shell = Shell.instance(displayhook_class=Hook, display_pub_class=Publisher)

    # An interrupt stops the code running, as in Jupyter, and nothing else:
    # between executions, or raised half-way through writing an event, it
    # would cut the event in half.
    def interrupted(signum, frame):
        if not state['running']:
            return
        if state['emitting']:
            state['deferred'] = True
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    emit('ready', {})
    for line in requests:
        req = json.loads(line)
        state['id'] = req['id']
        silent = bool(req.get('silent'))
        state['running'] = True
        try:
            result = shell.run_cell(req['code'], store_history=not silent, silent=silent)
        except KeyboardInterrupt:
            result = None
        finally:
            state['running'] = False
            state['deferred'] = False
        stdout.flush()
        stderr.flush()
        # Behind whatever programs the code started wrote to fd 1 and 2
        # (one pipe): the interpreter reads up to it before it ends the
        # execution (kernel.go's syncMarker).
        try:
            os.write(1, b'\x00\x00aenv-sync\x00' + req['id'].encode() + b'\x00\x00aenv-sync\x00')
        except OSError:
            pass
        ok = result is not None and result.success
        emit('execute_reply', {'status': 'ok' if ok else 'error', 'execution_count': shell.execution_count - 1})
        emit('status', {'execution_state': 'idle'})
        state['id'] = None


main()
