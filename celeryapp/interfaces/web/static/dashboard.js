// Live parts of the pages: an element with data-live="URL" is re-filled from that URL every
// data-every milliseconds (server-rendered HTML fragments) until the fragment carries data-final.
"use strict";

// An instant's "here" part: the viewer's wall time beside the schedule's zone, as the CLI writes it
// (", 07:30 IST here", with the date when it is another day here), left empty when the viewer's
// offset is the schedule zone's at that instant. Only the browser knows the viewer's zone.
const HERE_FORMAT = new Intl.DateTimeFormat("en-GB", {
  year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
  hourCycle: "h23", timeZoneName: "short",
});

function localTimes(root) {
  for (const el of root.querySelectorAll("time.here")) {
    const at = new Date(el.getAttribute("datetime"));
    if (isNaN(at)) continue;
    if (-at.getTimezoneOffset() === parseInt(el.dataset.offset, 10)) { el.textContent = ""; continue; }
    const p = {};
    for (const part of HERE_FORMAT.formatToParts(at)) p[part.type] = part.value;
    const day = `${p.year}-${p.month}-${p.day}`;
    el.textContent = `, ${day === el.dataset.day ? "" : day + " "}${p.hour}:${p.minute} ${p.timeZoneName} here`;
  }
  for (const el of root.querySelectorAll(".localzone")) {
    el.textContent = "yours (" + Intl.DateTimeFormat().resolvedOptions().timeZone + ")";
  }
  // A form's wall times are the viewer's: the form sends the zone they are in (a shared address
  // keeps the zone it was made in).
  for (const field of root.querySelectorAll("input.viewer-zone")) {
    if (field.value) continue;
    field.value = Intl.DateTimeFormat().resolvedOptions().timeZone;
    const said = field.form && field.form.querySelector(".zone-said");
    if (said) said.textContent = field.value;
    // Without a from or a to the zone says nothing: the address stays as short as the filters.
    if (field.form) field.form.addEventListener("submit", () => {
      field.disabled = ![...field.form.querySelectorAll("input[type=datetime-local]")].some((f) => f.value);
    });
  }
}

function live(el) {
  const every = parseInt(el.dataset.every || "5000", 10);
  let timer = null;
  async function refresh() {
    if (el.querySelector("[data-final]")) return;
    try {
      const response = await fetch(el.dataset.live, { credentials: "same-origin", redirect: "manual" });
      if (response.type === "opaqueredirect" || response.status === 401 || response.status === 403) {
        window.location.reload(); // logged out: the page shows the login form
        return;
      }
      if (response.ok) {
        // The region is aria-live: replaced only when it changed, so that a screen reader
        // announces news, not the same page every few seconds.
        const html = await response.text();
        if (html !== el.dataset.shown) {
          el.innerHTML = html;
          el.dataset.shown = html;
          localTimes(el);
        }
        el.dataset.refreshed = String(Date.now());
      }
    } catch (err) {
      // Server away for a moment: try again at the next tick.
    }
    timer = setTimeout(refresh, document.hidden ? every * 4 : every);
  }
  timer = setTimeout(refresh, every);
}

function details() {
  const panel = document.getElementById("detail");
  if (!panel) return;
  let opener = null;
  function hide() {
    panel.hidden = true;
    if (opener && document.contains(opener)) opener.focus();
    opener = null;
  }
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !panel.hidden) hide();
  });
  document.addEventListener("click", async (event) => {
    const close = event.target.closest(".stepdetail .close");
    if (close) { event.preventDefault(); hide(); return; }
    const cell = event.target.closest("a[data-detail]");
    if (!cell) return;
    event.preventDefault();
    const response = await fetch(cell.dataset.detail, { credentials: "same-origin" });
    if (!response.ok) { window.location = cell.href; return; }
    panel.innerHTML = await response.text();
    panel.hidden = false;
    opener = cell;
    localTimes(panel);
    panel.scrollIntoView({ block: "nearest" });
    panel.focus();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  for (const el of document.querySelectorAll("[data-live]")) live(el);
  details();
});
