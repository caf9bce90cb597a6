/* Marque console: progressive enhancement only. Every action is a plain form that
   works without this file; with it, a running request's page keeps itself current by
   fetching its /live fragment (server-rendered, escaped HTML) every POLL_MS and
   swapping in each of its parts (data-live-part names the region it replaces). */
(function () {
  "use strict";
  var POLL_MS = 1500;
  var live = document.getElementById("live");
  if (!live || live.getAttribute("data-live") !== "true") { return; }
  var src = live.getAttribute("data-src");
  var first = live.getAttribute("data-state");

  function settleDecision(state) {
    if (state === "awaiting_approval") { return; }
    var form = document.querySelector("[data-testid=decide-form]");
    if (!form) { return; }
    var note = document.createElement("p");
    note.className = "notice";
    note.textContent = "This request is now " + state.replace(/_/g, " ") +
      ": it no longer waits for a decision.";
    form.parentNode.replaceChild(note, form);
  }

  function tick() {
    fetch(src, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.status === 401) {
          window.location.assign("/login?why=expired&next=" +
            encodeURIComponent(window.location.pathname));
          return null;
        }
        return response.ok ? response.text() : "";
      })
      .then(function (html) {
        if (html === null) { return; }
        if (html) {
          // The fragment is server-rendered and escaped; each part replaces its region.
          var fresh = document.createElement("template");
          fresh.innerHTML = html;
          var parts = fresh.content.querySelectorAll("[data-live-part]");
          for (var i = 0; i < parts.length; i += 1) {
            var region = document.getElementById(parts[i].getAttribute("data-live-part"));
            if (region) { region.innerHTML = parts[i].innerHTML; }
          }
          var status = live.querySelector("[data-testid=status]");
          var state = status ? status.getAttribute("data-state") : first;
          live.setAttribute("data-state", state);
          if (state !== first) { settleDecision(state); }
          if (status && status.getAttribute("data-live") !== "true") {
            live.setAttribute("data-live", "false");
            return;
          }
        }
        window.setTimeout(tick, POLL_MS);
      })
      .catch(function () { window.setTimeout(tick, POLL_MS * 2); });
  }
  window.setTimeout(tick, POLL_MS);
}());
