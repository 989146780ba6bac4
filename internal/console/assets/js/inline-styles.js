// xterm.js writes some of its styles (sizes, theme colours) into <style>
// elements it adds to its own element. The console's Content-Security-
// Policy refuses inline <style> elements (style-src 'self'), so their text
// is mirrored into constructed stylesheets, which the policy does not
// govern: the rules xterm.js computes apply, and no markup can add any.

/**
 * Mirrors the <style> elements under root into the document's adopted
 * stylesheets, following their changes, until the returned stop is called.
 */
export function mirrorInlineStyles(root) {
  const sheets = new Map();
  const sync = (el) => {
    let sheet = sheets.get(el);
    if (!sheet) {
      sheet = new CSSStyleSheet();
      sheets.set(el, sheet);
      document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
    }
    sheet.replaceSync(el.textContent || '');
  };
  const styleOf = (n) => (n && n.nodeName === 'STYLE' ? n : n && n.parentNode && n.parentNode.nodeName === 'STYLE' ? n.parentNode : null);
  const observer = new MutationObserver((records) => {
    for (const r of records) {
      const changed = styleOf(r.target);
      if (changed) sync(changed);
      for (const n of r.addedNodes) {
        if (n.nodeName === 'STYLE') sync(n);
        else if (n.querySelectorAll) n.querySelectorAll('style').forEach(sync);
      }
    }
  });
  observer.observe(root, { childList: true, subtree: true, characterData: true });
  return () => {
    observer.disconnect();
    const mine = new Set(sheets.values());
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter(s => !mine.has(s));
  };
}
