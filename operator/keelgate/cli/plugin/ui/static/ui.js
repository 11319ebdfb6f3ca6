// The decision inbox's one script: present the page key, and keep the page current.
//
// The key: a session is a cookie and a page key (operator/keelgate/cli/plugin/ui/sessions.py).
// The browser sends the cookie to every port of 127.0.0.1, so the cookie alone reads nothing;
// the key is kept in this origin's localStorage, which no other port can read, and sent in a
// header. Signing in lands on /k/KEY/: the key moves from the address to the storage, and out
// of the address and the page's links. A page opened with the cookie alone is a shell that
// this script fills, with the key, from the server.
//
// Live: the server says when something changed (server-sent events from its watches); the
// page then asks for a fresh <main> and swaps it in, keeping what the user typed and where the
// focus was. Without this script every page still works with the key in its address: forms
// post, links load.
(function () {
  "use strict";
  var STORED = "keelgate.pageKey";
  var live = document.getElementById("live");
  var main = document.getElementById("content");
  var who = document.getElementById("who");
  if (!main) return;

  function say(text) {
    if (live) live.textContent = text;
  }

  function strip(prefix) {
    document.querySelectorAll("a[href], form[action]").forEach(function (el) {
      var name = el.tagName === "A" ? "href" : "action";
      var value = el.getAttribute(name);
      if (value && value.indexOf(prefix + "/") === 0) {
        el.setAttribute(name, value.slice(prefix.length));
      }
    });
  }

  var key = null;
  var inAddress = /^\/k\/([A-Za-z0-9_-]+)(\/.*)?$/.exec(location.pathname);
  try {
    if (inAddress) localStorage.setItem(STORED, inAddress[1]);
    key = localStorage.getItem(STORED);
  } catch (e) {
    key = null;
  }
  if (inAddress) {
    if (key === inAddress[1]) {
      history.replaceState(null, "", (inAddress[2] || "/") + location.search + location.hash);
      strip("/k/" + key);
    } else {
      key = inAddress[1]; // no storage here: the key stays in the address, as without script
    }
  }
  var shell = document.body.dataset.shell === "1";
  if (!key) {
    say("Live: off (not signed in)");
    return;
  }

  var source = null, busy = false, again = false, timer = null, over = false;

  function ended() {
    over = true;
    if (source) source.close();
    try {
      localStorage.removeItem(STORED);
    } catch (e) { /* nothing kept */ }
    say("Session ended: open the newest sign-in address kubectl keelgate ui printed");
    main.innerHTML = '<p class="note" role="alert">This session ended (idle too long, or ' +
      "too old). Open the newest sign-in address <code>kubectl keelgate ui</code> printed " +
      "in its terminal (each address works once).</p>";
  }

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
      timer = setTimeout(function () { refresh("change"); },
        Math.max(0, soonest - Date.now()) + 500);
    }
  }

  function typed() {
    var kept = {};
    main.querySelectorAll("input[type=text], textarea").forEach(function (f) {
      if (f.id && f.value) kept[f.id] = f.value;
    });
    return kept;
  }

  // The approvals ticked for the batch, by what each box carries (the approval and the key of
  // the call it shows): a box whose call changed comes back unticked.
  function ticked() {
    var kept = {};
    main.querySelectorAll("input[type=checkbox]").forEach(function (f) {
      if (f.checked) kept[f.value] = true;
    });
    return kept;
  }

  // kind: "load" when a person opened the page (it counts as their activity), "change" when
  // the page follows the cluster by itself (it does not keep an idle session alive).
  function refresh(kind) {
    if (over) return;
    if (busy) { again = true; return; }
    busy = true;
    var focused = document.activeElement && document.activeElement.id;
    var kept = typed();
    var picked = ticked();
    fetch(location.pathname + location.search, {
      headers: { "X-Keelgate-Fragment": kind, "X-Keelgate-Key": key },
      credentials: "same-origin",
      cache: "no-store"
    }).then(function (r) {
      if (r.status === 401) { ended(); return null; }
      if (!r.ok) throw new Error(String(r.status));
      var user = r.headers.get("X-Keelgate-User");
      if (who && user) {
        who.textContent = "Signed in to the cluster as ";
        var strong = document.createElement("strong");
        strong.textContent = decodeURIComponent(user);
        who.appendChild(strong);
      }
      return r.text();
    }).then(function (html) {
      if (html === null) return;
      main.innerHTML = html;
      Object.keys(kept).forEach(function (id) {
        var f = document.getElementById(id);
        if (f) f.value = kept[id];
      });
      main.querySelectorAll("input[type=checkbox]").forEach(function (f) {
        if (picked[f.value]) f.checked = true;
      });
      if (focused) {
        var f = document.getElementById(focused);
        if (f) f.focus();
      }
      document.body.dataset.updated = String(Date.now());
      scheduleEnable();
    }).catch(function () {
      say("Live: could not refresh (reload the page)");
    }).then(function () {
      busy = false;
      if (again) { again = false; refresh("change"); }
    });
  }

  if (shell) refresh("load");
  else scheduleEnable();
  if (document.body.dataset.live !== "on" || !window.EventSource) {
    say("Live: off (reload to update)");
    return;
  }
  // An event stream cannot send a header: it names the key in its address, as a page
  // without script does.
  source = new EventSource("/k/" + key + "/events");
  source.addEventListener("hello", function () {
    say("Live: on");
    document.body.dataset.stream = "open";
  });
  source.addEventListener("change", function () { refresh("change"); });
  source.addEventListener("ended", ended);
  source.onerror = function () {
    if (over) return;
    say("Live: reconnecting");
    // Refused (the session ended) rather than cut: the browser does not try again; a fetch
    // of the page says why.
    if (source.readyState === EventSource.CLOSED) refresh("change");
  };
})();
