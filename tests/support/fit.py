"""Whether a dashboard page fits the screen it is on: no horizontal scrolling, and every control a
person taps in the main content at least ``TAP_MIN`` CSS pixels tall (WCAG 2.5.5's 44 px), and as
wide when it is a button, a summary or a check box. A link inside a sentence is exempt, as WCAG
2.5.8 exempts it: its size is the line's, and the sentence around it keeps taps apart."""

from __future__ import annotations

from typing import Any

TAP_MIN = 44

# Run in the page: returns {"scroll": [scrollWidth, clientWidth], "small": [descriptions]}.
_MEASURE = """
(min) => {
  const root = document.documentElement;
  const small = [];
  const main = document.querySelector('main');
  const shown = (el) => {
    if (!el.getClientRects().length) return false;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || style.display === 'none') return false;
    const box = el.getBoundingClientRect();
    // The visually hidden pattern (1x1 px, clipped) is for screen readers, not for taps.
    return box.width > 1 && box.height > 1;
  };
  const inSentence = (el) => {
    if (el.tagName !== 'A' || getComputedStyle(el).display !== 'inline') return false;
    const block = el.parentElement;
    const text = (block ? block.textContent : '').replace(/\\s+/g, ' ').trim();
    const own = el.textContent.replace(/\\s+/g, ' ').trim();
    return text.length > own.length;
  };
  const target = (el) => {
    // A check box or radio counts by the label it sits in (its tap target), when it has one.
    if (el.tagName === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio')) {
      const label = el.closest('label');
      if (label && shown(label)) return label;
    }
    return el;
  };
  const selector = 'a[href], button, input:not([type=hidden]), select, textarea, summary, [role=button]';
  for (const el of main.querySelectorAll(selector)) {
    if (!shown(el) || inSentence(el)) continue;
    const box = target(el).getBoundingClientRect();
    const squareish = el.tagName === 'BUTTON' || el.tagName === 'SUMMARY'
      || el.getAttribute('role') === 'button' || el.type === 'checkbox' || el.type === 'radio'
      || (el.classList && el.classList.contains('btn'));
    if (box.height + 0.5 < min || (squareish && box.width + 0.5 < min)) {
      const name = (el.getAttribute('aria-label') || el.textContent || el.name || el.type || '')
        .replace(/\\s+/g, ' ').trim().slice(0, 60);
      small.push(`${el.tagName.toLowerCase()} "${name}" ${Math.round(box.width)}x${Math.round(box.height)}`);
    }
  }
  // What sticks out past the right edge, innermost first: what to fix when the page scrolls.
  const out = [];
  const edge = root.clientWidth + 0.5;
  const past = (el) => el.getClientRects().length && el.getBoundingClientRect().right > edge;
  const named = (el) => `${el.tagName.toLowerCase()}.${[...el.classList].join('.')} "${el.textContent.trim().slice(0, 40)}"`;
  if (root.scrollWidth > root.clientWidth) {
    for (const el of document.body.querySelectorAll('*')) {
      if (!past(el) || [...el.children].some(past)) continue;
      out.push(named(el));
      if (out.length >= 5) break;
    }
    // Or text that overflows a box which itself fits.
    for (const el of document.body.querySelectorAll('*')) {
      if (out.length >= 5) break;
      if (getComputedStyle(el).overflowX !== 'visible' || el.scrollWidth <= el.clientWidth) continue;
      if (el.getBoundingClientRect().left + el.scrollWidth > edge) out.push(`overflowing ${named(el)}`);
    }
  }
  return {scroll: [root.scrollWidth, root.clientWidth], small, out};
}
"""


def misfits(page: Any) -> list[str]:
    """What is wrong with the page as shown: empty when it fits."""
    measured = page.evaluate(_MEASURE, TAP_MIN)
    problems = list(measured["small"])
    scroll_width, client_width = measured["scroll"]
    if scroll_width > client_width:
        problems.insert(
            0,
            f"the page scrolls sideways: {scroll_width} px of content in {client_width} px; "
            f"past the edge: {measured['out']}",
        )
    return problems
