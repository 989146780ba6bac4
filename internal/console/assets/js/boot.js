// The console's first script: it loads the rest (app.js and what that
// imports), and loads it again when a load failed. A browser on a host
// that runs sandboxes sees the host's network change whenever one starts
// or ends (each has interfaces of its own), and Chromium then fails the
// requests in flight, loopback's too (net::ERR_NETWORK_CHANGED): a page
// whose modules were loading at that moment would stay blank. A module
// that failed to load is fetched anew when imported again.

const tries = 5;

async function load(n) {
  try {
    await import('./app.js');
  } catch (e) {
    if (n + 1 < tries) {
      setTimeout(() => load(n + 1), 200 * (n + 1));
      return;
    }
    const p = document.createElement('p');
    p.className = 'error';
    p.setAttribute('role', 'alert');
    p.textContent = `The console's scripts did not load (${e.message}): reload the page.`;
    document.getElementById('main').replaceChildren(p);
    reportError(e);
  }
}

load(0);
