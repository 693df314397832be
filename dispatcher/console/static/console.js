// The console's only script: ages and countdowns tick, the overview refreshes itself.
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
  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 1000);
    var every = Number(document.body.getAttribute("data-refresh") || 0);
    if (every > 0) {
      setTimeout(function () { window.location.reload(); }, every * 1000);
    }
  });
})();
