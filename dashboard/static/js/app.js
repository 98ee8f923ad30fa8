// Saga Admin: small enhancements only. Every decision works without this file.
// Loaded as an external script (CSP script-src 'self'); no eval, no inline handlers.
(function () {
  "use strict";

  function isTyping(target) {
    if (!target) return false;
    var tag = target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || target.isContentEditable;
  }

  // --- Approval inbox: j/k move between cards, a/r focus the approve/reject reason field. ---
  // Shortcuts never submit anything: the reason is always typed, and Enter submits its form.
  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-approval-inbox] [data-approval]"));
  }

  // The current card's id survives htmx swapping the card for its decided version.
  var currentId = null;

  function currentIndex(list) {
    var active = document.activeElement;
    for (var i = 0; i < list.length; i++) {
      if (list[i] === active || list[i].contains(active)) return i;
    }
    for (var j = 0; j < list.length; j++) {
      if (list[j].id === currentId) return j;
    }
    return -1;
  }

  function select(list, index) {
    if (!list.length) return null;
    index = Math.max(0, Math.min(list.length - 1, index));
    list.forEach(function (card) { card.classList.remove("is-current"); });
    var card = list[index];
    card.classList.add("is-current");
    currentId = card.id;
    card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest", behavior: "smooth" });
    return card;
  }

  document.addEventListener("keydown", function (event) {
    if (!document.querySelector("[data-approval-inbox]")) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape" && isTyping(event.target)) {
      var owner = event.target.closest("[data-approval]");
      if (owner) { event.target.blur(); owner.focus(); }
      return;
    }
    if (isTyping(event.target)) return;
    var list = cards();
    var index = currentIndex(list);
    if (event.key === "j") {
      event.preventDefault();
      select(list, index + 1);
    } else if (event.key === "k") {
      event.preventDefault();
      select(list, index < 0 ? 0 : index - 1);
    } else if (event.key === "a" || event.key === "r") {
      var card = index < 0 ? select(list, 0) : list[index];
      if (!card) return;
      var field = card.querySelector(event.key === "a" ? "[data-approve-reason]" : "[data-reject-reason]");
      if (field) {
        event.preventDefault();
        field.focus();
      }
    }
  });

  // After a decision swaps a card in place, keep the keyboard where it was.
  document.addEventListener("htmx:afterSettle", function () {
    if (!currentId) return;
    var card = document.getElementById(currentId);
    var active = document.activeElement;
    if (card && (!active || active === document.body)) {
      card.classList.add("is-current");
      card.focus({ preventScroll: true });
    }
  });

  // --- Expiry countdowns keep ticking; the server-rendered text is the fallback. ---
  function formatRemaining(ms) {
    var s = Math.floor(ms / 1000);
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (s % 60) + "s";
    return (s % 60) + "s";
  }

  function tick() {
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var remaining = new Date(el.getAttribute("datetime")).getTime() - Date.now();
      if (remaining <= 0) {
        el.textContent = "expired";
        el.classList.add("expired");
        el.removeAttribute("data-countdown");
      } else {
        el.textContent = "expires in " + formatRemaining(remaining);
      }
    });
  }
  setInterval(tick, 1000);

  // --- Copy buttons (correction trail). ---
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy-target]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy-target"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.innerText.trim()).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    });
  });

  // --- Copy buttons only make sense with the clipboard API; reveal them when it exists (also in
  // what the run page's live poll swaps in, such as the correction trail). ---
  function revealCopyButtons() {
    if (navigator.clipboard) {
      document.querySelectorAll("[data-copy-target][hidden]").forEach(function (b) { b.hidden = false; });
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    revealCopyButtons();
    tick();
  });
  document.addEventListener("htmx:afterSettle", revealCopyButtons);
})();
