// Demo page for irpe-deploy: POST /classify with a picked, dropped or drawn image; show the top 5 as bars.
"use strict";
const $ = (id) => document.getElementById(id);

function authHeaders() {
  const key = localStorage.getItem("irpeApiKey");
  return key ? { Authorization: "Bearer " + key } : {};
}

async function request(url, options = {}) {
  options.headers = Object.assign({}, options.headers || {}, authHeaders());
  let resp = await fetch(url, options);
  if (resp.status === 401) {
    const key = prompt("This server needs an API key:");
    if (key) {
      localStorage.setItem("irpeApiKey", key);
      options.headers = Object.assign({}, options.headers, authHeaders());
      resp = await fetch(url, options);
    }
  }
  return resp;
}

function showBars(preds) {
  const bars = $("bars");
  bars.innerHTML = "";
  for (const p of preds) {
    const row = document.createElement("div");
    row.className = "bar";
    const pct = (100 * p.probability).toFixed(1);
    row.innerHTML = '<span class="label"></span><div class="track"><div class="fill"></div></div><span class="pct"></span>';
    row.children[0].textContent = p.label;
    row.children[0].title = p.label + " (#" + p.index + ")";
    row.children[1].firstChild.style.width = pct + "%";
    row.children[2].textContent = pct + "%";
    bars.appendChild(row);
  }
}

async function classify(blob) {
  $("error").textContent = "";
  const form = new FormData();
  form.append("file", blob, "image");
  const resp = await request("/classify?top_k=5", { method: "POST", body: form });
  const body = await resp.json();
  if (!resp.ok) {
    $("error").textContent = (body.error && body.error.message) || resp.statusText;
    return;
  }
  showBars(body.predictions[0]);
  $("timing").textContent = "total " + body.timing_ms.total.toFixed(1) + " ms (decode " +
    body.timing_ms.decode.toFixed(1) + ", queue " + body.timing_ms.queue.toFixed(1) + ", inference " +
    body.timing_ms.inference.toFixed(1) + ")";
}

function pick(file) {
  if (!file) return;
  $("preview").src = URL.createObjectURL(file);
  $("preview").style.display = "block";
  classify(file);
}

const drop = $("drop");
drop.addEventListener("click", () => $("file").click());
$("file").addEventListener("change", (e) => pick(e.target.files[0]));
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  pick(e.dataTransfer.files[0]);
});

const pad = $("pad");
const ctx = pad.getContext("2d");
function clearPad() { ctx.fillStyle = "#000"; ctx.fillRect(0, 0, pad.width, pad.height); }
clearPad();
let drawing = false;
function point(e) { const r = pad.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; }
pad.addEventListener("pointerdown", (e) => { drawing = true; ctx.beginPath(); ctx.moveTo(...point(e)); });
pad.addEventListener("pointermove", (e) => {
  if (!drawing) return;
  ctx.strokeStyle = "#fff"; ctx.lineWidth = 18; ctx.lineCap = "round"; ctx.lineJoin = "round";
  ctx.lineTo(...point(e)); ctx.stroke();
});
window.addEventListener("pointerup", () => { drawing = false; });
$("clear").addEventListener("click", clearPad);
$("classify-pad").addEventListener("click", () => pad.toBlob((b) => classify(b), "image/png"));

request("/v1/models").then((r) => r.json()).then((body) => {
  const m = body.models && body.models[0];
  $("model").textContent = m ? m.name + " · " + m.num_classes + " classes · " + m.backend + " on " + m.device
    : "no model loaded";
}).catch(() => { $("model").textContent = "model info unavailable"; });
