// The console's only script: ages and countdowns tick, the overview refreshes itself,
// a bulk operation's progress bar follows it.
// Every page works without it; it changes nothing the server said.
"use strict";
(function () {
  function span(seconds) {
    var s = Math.floor(Math.abs(seconds));
    var parts = [[Math.floor(s / 86400), "d"], [Math.floor(s % 86400 / 3600), "h"],
                 [Math.floor(s % 3600 / 60), "m"], [s % 60, "s"]];
    var shown = parts.filter(function (p) { return p[0] > 0; }).slice(0, 2)
      .map(function (p) { return p[0] + p[1]; });
    return shown.length ? shown.join(" ") : "0s";
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-since]").forEach(function (el) {
      var delta = (now - Date.parse(el.getAttribute("data-since"))) / 1000;
      el.textContent = delta >= 0 ? span(delta) + " ago" : "in " + span(delta);
    });
    document.querySelectorAll("[data-expires]").forEach(function (el) {
      var left = (Date.parse(el.getAttribute("data-expires")) - now) / 1000;
      el.textContent = left > 0 ? "expires in " + span(left) : "expired";
      el.classList.toggle("lapsed", left <= 0);
    });
  }
  // A bulk operation's bar follows its record: a small JSON polled until it finishes.
  function follow(bar) {
    var url = bar.getAttribute("data-progress-url");
    var percent = document.querySelector("[data-testid=operation-percent]");
    var counts = document.querySelector("[data-testid=operation-counts]");
    var state = document.querySelector("[data-testid=operation-state]");
    function poll() {
      fetch(url, {credentials: "same-origin"}).then(function (r) { return r.json(); })
        .then(function (p) {
          bar.value = p.percent;
          bar.textContent = p.percent + "%";
          if (percent) { percent.textContent = p.percent + "%"; }
          if (counts) { counts.textContent = p.done + " done, " + p.failed + " refused of " + p.total; }
          if (state) { state.textContent = p.state; state.className = "status status-" + p.state; }
          if (p.state === "running") { setTimeout(poll, 500); }
        }, function () { setTimeout(poll, 2000); });
    }
    poll();
  }
  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 1000);
    document.querySelectorAll("[data-progress-url]").forEach(follow);
    var every = Number(document.body.getAttribute("data-refresh") || 0);
    if (every > 0) {
      setTimeout(function () { window.location.reload(); }, every * 1000);
    }
  });
})();
