// Typeset the math that pymdownx.arithmatex marked (\( ... \) inline, \[ ... \] display), with
// the KaTeX copy vendored in assets/vendor/katex (no CDN). Runs again after each page load.
// A formula KaTeX cannot parse is logged with console.error, which the site's browser check
// (tests/test_site.py) turns into a failure.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
  });
});
