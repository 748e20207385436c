// stormguard dashboard: polls ./v1/stats once a second and turns its cumulative counters
// into rates. No dependencies: it is served by the service itself and works offline.
"use strict";
(function () {
  var POLL_MS = 1000, HISTORY = 120;
  var statsUrl = new URL("v1/stats", document.baseURI.replace(/dashboard\/?$/, "")).href;
  var previous = null, history = [];

  function el(id) { return document.getElementById(id); }
  function fmt(x) {
    if (x >= 100) { return Math.round(x).toLocaleString("en"); }
    return (Math.round(x * 10) / 10).toLocaleString("en");
  }
  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) { td.className = cls; }
    row.appendChild(td);
  }
  function fill(tbodyOf, rows, empty) {
    var tbody = el(tbodyOf).querySelector("tbody");
    tbody.textContent = "";
    if (rows.length === 0 && empty) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = 5;
      td.className = "empty";
      td.textContent = empty;
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    rows.forEach(function (cells) {
      var tr = document.createElement("tr");
      cells.forEach(function (c) { cell(tr, c[0], c[1]); });
      tbody.appendChild(tr);
    });
  }

  function rates(now) {
    var out = { allowed: 0, denied: 0, rules: {} };
    var dt = previous ? Math.max(now.time - previous.time, 0.001) : 0;
    Object.keys(now.rules).forEach(function (name) {
      var cur = now.rules[name], old = previous && previous.rules[name];
      var r = { allowed: 0, denied: 0, shadow_denied: 0 };
      if (old && dt) {
        r.allowed = Math.max(cur.allowed - old.allowed, 0) / dt;
        r.denied = Math.max(cur.denied - old.denied, 0) / dt;
        r.shadow_denied = Math.max(cur.shadow_denied - old.shadow_denied, 0) / dt;
      }
      out.rules[name] = r;
      out.allowed += r.allowed;
      out.denied += r.denied;
    });
    return out;
  }

  function draw() {
    var canvas = el("chart"), ctx = canvas.getContext("2d");
    var w = canvas.width, h = canvas.height, pad = 24;
    ctx.clearRect(0, 0, w, h);
    var top = 1;
    history.forEach(function (p) { top = Math.max(top, p.allowed, p.denied); });
    ctx.strokeStyle = "#e5e7eb";
    ctx.fillStyle = "#6b7280";
    ctx.font = "11px sans-serif";
    ctx.beginPath(); ctx.moveTo(pad, h - pad); ctx.lineTo(w, h - pad); ctx.stroke();
    ctx.fillText(fmt(top) + "/s", 2, 12);
    [["allowed", "#2e7d32"], ["denied", "#c62828"]].forEach(function (series) {
      ctx.strokeStyle = series[1];
      ctx.lineWidth = 2;
      ctx.beginPath();
      history.forEach(function (p, i) {
        var x = pad + (w - pad) * (i + HISTORY - history.length) / (HISTORY - 1);
        var y = h - pad - (h - 2 * pad) * p[series[0]] / top;
        if (i === 0) { ctx.moveTo(x, y); } else { ctx.lineTo(x, y); }
      });
      ctx.stroke();
    });
  }

  function render(now) {
    var r = rates(now);
    el("rate-allowed").textContent = fmt(r.allowed);
    el("rate-denied").textContent = fmt(r.denied);
    el("total-checks").textContent = now.checks.toLocaleString("en");
    el("degraded").textContent = now.degraded.toLocaleString("en");
    el("store").textContent = "store: " + now.store.name + " (on_error=" + now.store.on_error + ")";
    var health = el("health");
    health.textContent = now.degraded_now ? "DEGRADED: the store fails" : "store answering";
    health.className = "pill " + (now.degraded_now ? "bad" : "ok");
    fill("rules", Object.keys(now.rules).map(function (name) {
      var x = r.rules[name];
      return [[name], [fmt(x.allowed), "ok"], [fmt(x.denied), "bad"],
              [fmt(x.shadow_denied)], [now.rules[name].denied.toLocaleString("en")]];
    }), "no check yet");
    fill("top-keys", now.top.map(function (t) {
      return [[t.key, "key"], [t.count.toLocaleString("en")], [t.rules.join(", ")]];
    }), "no key denied yet");
    fill("breakers", now.breakers.map(function (b) {
      return [[b.name], [b.kind], [b.state, "state-" + b.state]];
    }), "no breaker: the store has none, no CircuitBreaker in this process");
    el("queues-section").hidden = now.queues.length === 0;
    fill("queues", now.queues.map(function (q) {
      return [[q.name], [q.kind], [q.depth === null ? "-" : String(q.depth)]];
    }));
    if (previous) {
      history.push({ allowed: r.allowed, denied: r.denied });
      if (history.length > HISTORY) { history.shift(); }
    }
    previous = now;
    draw();
    el("updated").textContent = "updated " + new Date(now.time * 1000).toLocaleTimeString("en");
  }

  function poll() {
    fetch(statsUrl, { cache: "no-store" })
      .then(function (resp) {
        if (!resp.ok) { throw new Error("HTTP " + resp.status); }
        return resp.json();
      })
      .then(render)
      .catch(function (err) { el("updated").textContent = "unreachable: " + err.message; })
      .finally(function () { setTimeout(poll, POLL_MS); });
  }
  poll();
}());
