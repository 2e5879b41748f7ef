// jetsched console: the live events tail (Server-Sent Events). Each message is a table row the
// server rendered (and escaped); without JavaScript the events page lists the recent ones.
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
