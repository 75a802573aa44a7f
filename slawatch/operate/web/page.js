// The on-call page's buttons (slawatch/page.py): each calls the admin JSON API with
// fetch, then reloads the page to show the result. Every write carries the
// X-Slawatch-Page header, without which the admin API refuses a write authorised by
// the login cookie (a form on another site cannot send it). Texts from the server
// are only ever set as textContent.
"use strict";
(function () {
  const status = document.getElementById("status");
  const who = document.getElementById("who");
  const KEY = "slawatch.who";

  if (who) {
    // A name typed before this script ran (it is deferred) is kept, not replaced.
    who.value = who.value || localStorage.getItem(KEY) || "";
    who.addEventListener("change", () => localStorage.setItem(KEY, who.value.trim()));
  }

  function say(text, bad) {
    status.textContent = text;
    status.className = bad ? "bad" : "";
  }

  function author() {
    const name = who ? who.value.trim() : "";
    if (!name) {
      if (who) who.focus();
      throw new Error("enter your name in 'Acting as' first");
    }
    localStorage.setItem(KEY, name);
    return name;
  }

  async function call(method, url, body) {
    const response = await fetch(url, {
      method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Slawatch-Page": "1" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let answer = null;
    try {
      answer = await response.json();
    } catch (e) {
      answer = null;
    }
    if (!response.ok) {
      throw new Error((answer && answer.error) || `HTTP ${response.status}`);
    }
    return answer;
  }

  async function act(work, done) {
    try {
      say("…", false);
      const answer = await work();
      say(done(answer), false);
      setTimeout(() => location.reload(), 300);
    } catch (e) {
      say(e.message, true);
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const data = button.dataset;
    if (data.action === "ack") {
      act(
        () => call("POST", `/v1/alerts/${encodeURIComponent(data.alert)}/ack`, { by: author() }),
        (a) => `episode ${a.episode} of ${a.rule}:${a.key}: ${a.state}`,
      );
    } else if (data.action === "expire") {
      act(
        () => call("DELETE", `/v1/silences/${encodeURIComponent(data.silence)}`),
        (s) => `silence ${s.id} expired`,
      );
    } else if (data.action === "silence") {
      const form = document.getElementById("silence-form");
      form.elements.rule.value = data.rule;
      form.elements.key.value = data.key || "";
      document.getElementById("new-silence").open = true;
      form.scrollIntoView({ block: "center" });
      form.elements.until.focus();
    }
  });

  // The SLA chart (operate/chart.py draws the same for `report --format html|svg`: change
  // both): per rule, the episodes that fell due each period (bars, scaled to
  // the busiest period of all rules) and the compliance (a line from 0 to 100 %),
  // drawn from /v1/report. Every value reaches the page as an attribute or textContent.
  const SVG = "http://www.w3.org/2000/svg";
  function svg(name, attrs) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function slaChart(rule, rows, top) {
    const W = 24, H = 60, figure = document.createElement("figure");
    figure.className = "sla";
    figure.dataset.rule = rule;
    const chart = svg("svg", { viewBox: `0 0 ${rows.length * W} ${H}`, role: "img" });
    const points = [];
    rows.forEach((row, i) => {
      const h = row.breached === 0 ? 0 : Math.max(1, Math.round((row.breached / top) * (H - 4)));
      const bar = svg("rect", {
        class: "breached", x: i * W + 4, y: H - h, width: W - 8, height: h,
        "data-period": row.period, "data-breached": row.breached,
      });
      const title = svg("title", {});
      const compliance = row.compliance === null ? "not counted" : `${(row.compliance * 100).toFixed(1)} %`;
      title.textContent = `${row.period.slice(0, 10)}: ${row.breached} breached, compliance ${compliance}`;
      bar.appendChild(title);
      chart.appendChild(bar);
      if (row.compliance !== null) points.push(`${i * W + W / 2},${(1 - row.compliance) * (H - 2) + 1}`);
    });
    if (points.length) {
      chart.appendChild(svg("polyline", { class: "compliance", points: points.join(" ") }));
    }
    const total = rows.reduce((n, r) => n + r.breached, 0);
    chart.setAttribute("aria-label", `${rule}: ${total} breached over ${rows.length} periods`);
    const caption = document.createElement("figcaption");
    caption.textContent = `${rule}: ${total} breached`;
    figure.append(chart, caption);
    return figure;
  }

  const slaBox = document.querySelector(".sla-charts[data-src]");
  if (slaBox) {
    fetch(slaBox.dataset.src, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`HTTP ${r.status}`))))
      .then((report) => {
        const byRule = new Map();
        for (const row of report.rows) {
          if (!byRule.has(row.rule)) byRule.set(row.rule, []);
          byRule.get(row.rule).push(row);
        }
        // Not Math.max(...rows): a spread of every rule's days can pass the engine's
        // limit on arguments (thousands of rules).
        const top = report.rows.reduce((m, r) => Math.max(m, r.breached), 1);
        for (const [rule, rows] of byRule) slaBox.appendChild(slaChart(rule, rows, top));
        slaBox.dataset.loaded = "1";
      })
      .catch((e) => {
        slaBox.textContent = `SLA report unavailable: ${e.message}`;
        slaBox.dataset.loaded = "error";
      });
  }

  const form = document.getElementById("silence-form");
  if (form) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const f = form.elements;
      act(
        () => {
          const body = {
            rule: f.rule.value,
            until: f.until.value.trim(),
            comment: f.comment.value,
            author: author(),
          };
          if (f.key.value !== "") body.key = f.key.value;
          if (f.matchers.value.trim() !== "") {
            try {
              body.matchers = JSON.parse(f.matchers.value);
            } catch (e) {
              throw new Error('row fields: write a JSON object, e.g. {"user_id": 7}');
            }
          }
          return call("POST", "/v1/silences", body);
        },
        (s) => `silence ${s.id} of ${s.rule} until ${s.ends_at}`,
      );
    });
  }
})();
