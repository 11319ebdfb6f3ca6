// The decision inbox's one script: keep the page current. The server says when something
// changed (server-sent events from its watches); the page then asks for a fresh <main> and swaps
// it in, keeping what the user typed and where the focus was. Without this script every page
// still works: forms post, links load.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var main = document.getElementById("content");
  if (!main || document.body.dataset.live !== "on" || !window.EventSource) {
    if (live) live.textContent = "Live: off (reload to update)";
    return;
  }
  var busy = false, again = false, timer = null;

  // A button disabled until a moment (Not executed, before the write deadline) comes back
  // enabled at that moment: the page asks for itself again then.
  function scheduleEnable() {
    if (timer) { clearTimeout(timer); timer = null; }
    var soonest = Infinity;
    main.querySelectorAll("[data-enable-at]").forEach(function (b) {
      var at = Date.parse(b.getAttribute("data-enable-at"));
      if (!isNaN(at)) soonest = Math.min(soonest, at);
    });
    if (soonest !== Infinity) {
      timer = setTimeout(refresh, Math.max(0, soonest - Date.now()) + 500);
    }
  }

  function typed() {
    var kept = {};
    main.querySelectorAll("input[type=text], textarea").forEach(function (f) {
      if (f.id && f.value) kept[f.id] = f.value;
    });
    return kept;
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    var focused = document.activeElement && document.activeElement.id;
    var kept = typed();
    fetch(location.pathname + location.search, {
      headers: { "X-Keelgate-Fragment": "1" },
      credentials: "same-origin",
      cache: "no-store"
    }).then(function (r) {
      if (!r.ok) throw new Error(String(r.status));
      return r.text();
    }).then(function (html) {
      main.innerHTML = html;
      Object.keys(kept).forEach(function (id) {
        var f = document.getElementById(id);
        if (f) f.value = kept[id];
      });
      if (focused) {
        var f = document.getElementById(focused);
        if (f) f.focus();
      }
      document.body.dataset.updated = String(Date.now());
      scheduleEnable();
    }).catch(function () {
      if (live) live.textContent = "Live: could not refresh (reload the page)";
    }).then(function () {
      busy = false;
      if (again) { again = false; refresh(); }
    });
  }

  scheduleEnable();
  var source = new EventSource("/events");
  source.addEventListener("hello", function () {
    if (live) live.textContent = "Live: on";
    document.body.dataset.stream = "open";
  });
  source.addEventListener("change", refresh);
  source.onerror = function () {
    if (live) live.textContent = "Live: reconnecting";
  };
})();
