// jetsched console: the live events tail (Server-Sent Events; each message is a table row the
// server rendered and escaped), times in the reader's zone, and pages that update themselves.
// Without JavaScript every page still reads: server-rendered UTC times, reloads where needed.
(function () {
  "use strict";
  var status = document.getElementById("live-status");
  var rows = document.getElementById("event-rows");
  if (!status || !rows || !window.EventSource) { return; }
  var source = new EventSource(status.getAttribute("data-stream"));
  var received = 0;
  source.addEventListener("open", function () {
    status.textContent = "Live: connected, new events appear at the top.";
    status.className = "live";
  });
  source.addEventListener("event", function (message) {
    var body = document.createElement("tbody");
    body.innerHTML = message.data;
    var row = body.firstElementChild;
    if (!row) { return; }
    row.classList.add("fresh");
    rows.insertBefore(row, rows.firstChild);
    received += 1;
    status.textContent = "Live: " + received + " new event" + (received === 1 ? "" : "s") + " since the page loaded.";
    while (rows.children.length > 500) { rows.removeChild(rows.lastChild); }
  });
  source.addEventListener("lagged", function (message) {
    status.textContent = "Live: " + message.data + " events skipped (too many at once).";
  });
  source.addEventListener("error", function () {
    status.textContent = "Live: disconnected, retrying…";
    status.className = "";
  });
})();

// Times: every <time datetime> the server rendered (UTC) is redrawn in the zone the reader
// chose (UTC, this browser's, or the task's when the page names one), remembered in
// localStorage; the relative time beside it ("3 min ago") is kept current.
(function () {
  "use strict";
  var KEY = "jetsched-zone";
  var choice = document.getElementById("zone-choice");
  function stored() {
    try { return window.localStorage.getItem(KEY) || "utc"; } catch (e) { return "utc"; }
  }
  function relative(ms) {
    var s = Math.floor(Math.abs(ms) / 1000), text;
    if (s === 0) { return "now"; }
    if (s < 60) { text = s + " s"; }
    else if (s < 3600) { text = Math.floor(s / 60) + " min"; }
    else if (s < 86400) { text = Math.floor(s / 3600) + " h"; }
    else { text = Math.floor(s / 86400) + " d"; }
    return ms < 0 ? text + " ago" : "in " + text;
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function format(date, zone) {
    if (zone === "UTC") {
      return date.getUTCFullYear() + "-" + pad(date.getUTCMonth() + 1) + "-" + pad(date.getUTCDate()) + " " +
        pad(date.getUTCHours()) + ":" + pad(date.getUTCMinutes()) + ":" + pad(date.getUTCSeconds()) + "Z";
    }
    var options = { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
      second: "2-digit", hourCycle: "h23", timeZoneName: "short" };
    if (zone) { options.timeZone = zone; }
    try {
      var parts = {};
      new Intl.DateTimeFormat("en-CA", options).formatToParts(date).forEach(function (p) { parts[p.type] = p.value; });
      return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" + parts.minute + ":" +
        parts.second + " " + parts.timeZoneName;
    } catch (e) {
      return format(date, "UTC");
    }
  }
  function zoneOf(element, mode) {
    if (mode === "browser") { return undefined; }
    if (mode === "task") {
      var holder = element.closest("[data-zone]");
      return holder ? holder.getAttribute("data-zone") : "UTC";
    }
    return "UTC";
  }
  function redraw() {
    var mode = stored(), now = Date.now();
    document.documentElement.setAttribute("data-zone-mode", mode);
    var times = document.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var element = times[i], date = new Date(element.getAttribute("datetime"));
      if (isNaN(date.getTime())) { continue; }
      element.textContent = format(date, zoneOf(element, mode));
      element.title = format(date, "UTC");
      var rel = element.nextElementSibling;
      if (rel && rel.classList.contains("rel")) { rel.textContent = "(" + relative(date.getTime() - now) + ")"; }
    }
  }
  if (choice) {
    choice.value = stored();
    choice.parentElement.hidden = false;
    choice.addEventListener("change", function () {
      try { window.localStorage.setItem(KEY, choice.value); } catch (e) { /* private mode: this page only */ }
      redraw();
    });
  }
  window.jetschedRedrawTimes = redraw;
  redraw();
  window.setInterval(redraw, 10000);
  document.body.addEventListener("htmx:afterSwap", redraw);
})();

// Live pages: a <main data-live="/events/stream?..."> is redrawn from the server after new
// events (at most every two seconds) while it is open; a page that stops being live (a run
// that finished) closes its stream.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource || !window.fetch) { return; }
  var source = new EventSource(main.getAttribute("data-live"));
  var pending = false, last = 0;
  function update() {
    pending = false;
    last = Date.now();
    fetch(window.location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" })
      .then(function (reply) { return reply.ok ? reply.text() : null; })
      .then(function (text) {
        if (!text) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main");
        if (!fresh) { return; }
        main.innerHTML = fresh.innerHTML;
        if (!fresh.hasAttribute("data-live")) {
          main.removeAttribute("data-live");
          source.close();
        }
        main.setAttribute("data-updated", String(Date.now()));
        if (window.jetschedRedrawTimes) { window.jetschedRedrawTimes(); }
      })
      .catch(function () { /* the next event tries again */ });
  }
  source.addEventListener("event", function () {
    if (pending) { return; }
    pending = true;
    window.setTimeout(update, Math.max(0, 2000 - (Date.now() - last)));
  });
})();
