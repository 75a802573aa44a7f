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
    who.value = localStorage.getItem(KEY) || "";
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
