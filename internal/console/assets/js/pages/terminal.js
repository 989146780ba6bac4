// A sandbox's terminal: xterm.js over a WebSocket to the console's
// terminal route, which runs a login shell on a PTY in the sandbox through
// envd. Binary messages are the terminal's bytes both ways; text messages
// are JSON: {type: 'resize', cols, rows} from here, {type: 'exit', code}
// or {type: 'error', message} from the server before it closes.

import { Terminal } from '../../vendor/xterm/xterm.mjs';
import { FitAddon } from '../../vendor/xterm-addon-fit/addon-fit.mjs';
import { csrf } from '../api.js';
import { h } from '../ui.js';

/**
 * The terminal card for sandbox id: {section, setState(state), stop()}.
 * It connects only when asked (a shell per open), and closing it, or
 * leaving the page, ends the shell.
 */
export function terminalCard(id) {
  const status = h('p', { class: 'status', role: 'status' }, 'Not connected.');
  const openButton = h('button', { type: 'button', class: 'primary' }, 'Open terminal');
  const closeButton = h('button', { type: 'button', disabled: true }, 'Close terminal');
  const holder = h('div', { class: 'term-holder' });
  // Where Shift+Esc puts focus: after the terminal, so that Tab goes on
  // to what follows it (Shift+Tab back into it).
  const hint = h('p', { class: 'sub', tabindex: '-1' }, 'While the terminal has focus every key goes to the shell, Tab included: press Shift+Esc to move focus out of it.');
  const section = h('section', { class: 'card', 'aria-labelledby': 'sb-term-h' },
    h('h2', { id: 'sb-term-h' }, 'Terminal'),
    h('div', { class: 'buttons' }, openButton, closeButton),
    status,
    holder,
    hint);

  let session = null;
  let running = true;
  // leftover disposes of an ended session's terminal, kept on screen.
  let leftover = null;

  function open() {
    if (session) return;
    const box = h('div', { class: 'term', role: 'region', 'aria-label': `Terminal of sandbox ${id}` });
    holder.replaceChildren(box);
    const term = new Terminal({
      cursorBlink: true,
      scrollback: 5000,
      fontSize: 14,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, monospace',
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    term.attachCustomKeyEventHandler((ev) => {
      if (ev.type === 'keydown' && ev.key === 'Escape' && ev.shiftKey) {
        hint.focus();
        return false;
      }
      return true;
    });

    const q = new URLSearchParams({ csrf: csrf(), cols: String(term.cols), rows: String(term.rows) });
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(`${scheme}//${location.host}/console/api/sandboxes/${encodeURIComponent(id)}/terminal?${q}`);
    ws.binaryType = 'arraybuffer';
    const encoder = new TextEncoder();
    let connected = false;
    let ending = '';
    const send = (data) => { if (ws.readyState === WebSocket.OPEN) ws.send(data); };

    ws.addEventListener('open', () => {
      connected = true;
      status.textContent = 'Connected: a login shell in the sandbox.';
      term.focus();
    });
    ws.addEventListener('message', (ev) => {
      if (typeof ev.data !== 'string') {
        term.write(new Uint8Array(ev.data));
        return;
      }
      let m = {};
      try { m = JSON.parse(ev.data); } catch { return; }
      if (m.type === 'exit') ending = m.code ? `The shell exited with status ${m.code}.` : 'The shell exited.';
      else if (m.type === 'error') ending = `The terminal stopped: ${m.message}`;
    });
    ws.addEventListener('close', () => {
      status.textContent = ending || (connected ? 'Disconnected.' : 'Could not open the terminal: the sandbox may be paused or gone.');
      term.options.disableStdin = true;
      term.options.cursorBlink = false;
      if (session && session.ws === ws) finish(false);
    });
    term.onData((d) => send(encoder.encode(d)));
    term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
    term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));
    const resize = new ResizeObserver(() => { try { fit.fit(); } catch { /* hidden */ } });
    resize.observe(box);

    session = { ws, term, resize };
    status.textContent = 'Connecting…';
    openButton.disabled = true;
    closeButton.disabled = false;
  }

  // finish ends the session; the terminal's text stays to be read (and
  // copied) unless clear.
  function finish(clear) {
    if (!session) return;
    const { ws, term, resize } = session;
    session = null;
    resize.disconnect();
    if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) ws.close(1000, 'closed from the page');
    if (clear) {
      dropLeftover();
      term.dispose();
      holder.replaceChildren();
      status.textContent = 'Not connected.';
    } else {
      leftover = () => term.dispose();
    }
    openButton.disabled = !running;
    closeButton.disabled = true;
    if (clear) openButton.focus();
  }

  function dropLeftover() {
    if (leftover) { leftover(); leftover = null; }
  }

  function reopen() {
    dropLeftover();
    open();
  }

  openButton.addEventListener('click', reopen);
  closeButton.addEventListener('click', () => finish(true));

  return {
    section,
    /** Follows the sandbox's state: a terminal opens only in a running one. */
    setState(state) {
      running = state === 'running';
      if (!session) openButton.disabled = !running;
    },
    stop() {
      finish(true);
      dropLeftover();
    },
  };
}
