// What a reader would see as broken on a page of the built documentation; returns a list of
// sentences. Run by tests/test_browser.py in headless Chromium, after MathJax has typeset.
const problems = [];
const describe = (el) => {
  const text = (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 70);
  const cls = typeof el.className === 'string' && el.className ? '.' + el.className.split(' ')[0] : '';
  return `<${el.tagName.toLowerCase()}${cls}> "${text}"`;
};
const article = document.querySelector('article') || document.body;
const column = article.getBoundingClientRect();
const page = document.documentElement;
if (page.scrollWidth > page.clientWidth + 1) {
  problems.push(`the page scrolls sideways: ${page.scrollWidth} px wide in a ${page.clientWidth} px window`);
}
const scrolls = (style) => style.overflowX === 'auto' || style.overflowX === 'scroll';
const insideScroller = (el) => {
  for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
    if (scrolls(getComputedStyle(a))) return true;
  }
  return false;
};
const contentRight = (el, rect) => {  // furo pads some boxes into negative margins
  const style = getComputedStyle(el);
  return rect.right - parseFloat(style.paddingRight) - parseFloat(style.borderRightWidth);
};
for (const el of article.querySelectorAll('*')) {
  if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') continue;  // inside a figure
  const style = getComputedStyle(el);
  if (style.display === 'none' || style.visibility === 'hidden') continue;
  const rect = el.getBoundingClientRect();
  if (rect.width === 0 && rect.height === 0) continue;
  if (insideScroller(el)) continue;  // it scrolls with its box; the box itself is checked
  const right = contentRight(el, rect);
  if (right > column.right + 1) {
    problems.push(`${describe(el)} runs ${Math.round(right - column.right)} px past the content column`);
    continue;
  }
  const clips = style.overflowX === 'hidden' || style.overflowX === 'clip';
  if (clips && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
    problems.push(`${describe(el)}: content is cut off (${el.scrollWidth} px in ${el.clientWidth} px)`);
  }
  const cell = el.tagName === 'TD' || el.tagName === 'TH';
  if (cell && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
    problems.push(`${describe(el)}: content overflows its cell (${el.scrollWidth} px in ${el.clientWidth} px)`);
  }
  // Text that spills out of its box (a long line in a block that neither wraps nor scrolls).
  if (scrolls(style)) continue;
  for (const child of el.childNodes) {
    if (child.nodeType !== Node.TEXT_NODE || !child.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(child);
    const textRight = range.getBoundingClientRect().right;
    if (textRight > column.right + 1) {
      problems.push(`${describe(el)}: its text runs ${Math.round(textRight - column.right)} px past the content column`);
      break;
    }
  }
}
// Math: every math element typeset by MathJax, no TeX error, no raw LaTeX left in the text.
const maths = article.querySelectorAll('.math');
if (maths.length && !window.MathJax) problems.push(`${maths.length} math elements and no MathJax loaded`);
for (const el of maths) {
  if (!el.querySelector('mjx-container')) problems.push(`math left unrendered: ${describe(el)}`);
}
for (const el of article.querySelectorAll('mjx-merror, [data-mjx-error]')) {
  problems.push(`a TeX error: ${el.getAttribute('data-mjx-error') || describe(el)}`);
}
const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
const raw = /\\\(|\\\[|\\(frac|mathbb|mathrm|sum|prod|sqrt|log|mid|leq|geq)\b|\$\$/;
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  const parent = node.parentElement;
  if (!parent || parent.closest('pre, code, script, style, mjx-container, mjx-assistive-mml, .highlight')) continue;
  if (raw.test(node.textContent)) problems.push(`raw LaTeX in the text: "${node.textContent.trim().slice(0, 70)}"`);
}
return problems;
