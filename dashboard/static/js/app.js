// Saga Admin: small enhancements only. Every decision works without this file.
// Loaded as an external script (CSP script-src 'self'); no eval, no inline handlers.
(function () {
  "use strict";

  function isTyping(target) {
    if (!target) return false;
    var tag = target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || target.isContentEditable;
  }

  // --- Keyboard lists: j/k move a visible selection between the entries of a list, and each list
  // adds its own keys. The approval inbox: a/r focus the approve/reject reason field (shortcuts
  // never submit anything: the reason is always typed, and Enter submits its form). The recovery
  // queue: Enter opens the selected item's run. Keys typed into a field are never taken.
  function focusField(selector) {
    return function (entry, event) {
      var field = entry.querySelector(selector);
      if (field) {
        event.preventDefault();
        field.focus();
      }
    };
  }

  var LISTS = [
    {
      list: "[data-approval-inbox]",
      entry: "[data-approval]",
      keys: { a: focusField("[data-approve-reason]"), r: focusField("[data-reject-reason]") },
    },
    {
      list: "[data-keyboard-list]",
      entry: "[data-keyboard-entry]",
      keys: {
        Enter: function (entry, event) {
          // Only the row itself: Enter on a link or a checkbox inside it keeps its own meaning.
          if (event.target !== entry) return;
          var link = entry.querySelector("[data-keyboard-open]");
          if (link) {
            event.preventDefault();
            link.click();
          }
        },
      },
    },
  ];

  function activeList() {
    for (var i = 0; i < LISTS.length; i++) {
      if (document.querySelector(LISTS[i].list)) return LISTS[i];
    }
    return null;
  }

  function entries(config) {
    return Array.prototype.slice.call(document.querySelectorAll(config.list + " " + config.entry));
  }

  // The current entry's id survives htmx swapping it (a decided card, a refreshed list).
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
    list.forEach(function (entry) { entry.classList.remove("is-current"); });
    var entry = list[index];
    entry.classList.add("is-current");
    currentId = entry.id;
    entry.focus({ preventScroll: true });
    entry.scrollIntoView({ block: "nearest", behavior: "smooth" });
    return entry;
  }

  document.addEventListener("keydown", function (event) {
    var config = activeList();
    if (!config) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape" && isTyping(event.target)) {
      var owner = event.target.closest(config.entry);
      if (owner) { event.target.blur(); owner.focus(); }
      return;
    }
    if (isTyping(event.target)) return;
    var list = entries(config);
    var index = currentIndex(list);
    if (event.key === "j") {
      event.preventDefault();
      select(list, index + 1);
    } else if (event.key === "k") {
      event.preventDefault();
      select(list, index < 0 ? 0 : index - 1);
    } else if (Object.prototype.hasOwnProperty.call(config.keys, event.key)) {
      var entry = index < 0 ? (event.key === "Enter" ? null : select(list, 0)) : list[index];
      if (entry) config.keys[event.key](entry, event);
    }
  });

  // After a swap, keep the keyboard where it was.
  document.addEventListener("htmx:afterSettle", function () {
    if (!currentId) return;
    var entry = document.getElementById(currentId);
    var active = document.activeElement;
    if (entry && (!active || active === document.body)) {
      entry.classList.add("is-current");
      entry.focus({ preventScroll: true });
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
