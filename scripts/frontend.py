"""ComfyUI's real web frontend, driven in headless Chromium over the DevTools protocol.

ComfyUI core has no Python converter between the workflow format the UI saves (`{"nodes", "links"}` with
positional `widgets_values`) and the API format the server runs (`{id: {"class_type", "inputs"}}`): the
frontend's JavaScript does it (`app.graphToPrompt()`). So this module opens a running server's own web UI in
Debian's headless Chromium (scripts/ensure_chromium.sh installs it) and asks the frontend itself:

    with Frontend(server) as ui:                 # server: a started scripts/comfy_server.ComfyServer
        workflow = load_ui_workflow("workflows/flux1_schnell_offload.json")
        conv = ui.convert(workflow, "flux1_schnell_offload")
        conv.check({"model": None})              # raises on missing node types, widget errors, warnings
        result = run_workflow(server, conv, models={"FLUX.1-schnell": "tiny-flux"})
        ui.screenshot(workflow, "docs/images/flux1_schnell_offload.png")

It needs no Python package beyond `websocket-client` (already a test dependency): the DevTools protocol is
JSON over a websocket. Chromium runs with a fresh profile and without any network access beyond the server.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import websocket

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the pack's root, for its settings

from backend.protocol import settings  # noqa: E402

CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser")
# Inputs that name a model folder or a model file: what a workflow names need not be installed where it is
# converted, and the tests swap real names for tiny models through them (clip_name1, clip_name2: ComfyUI's own
# CLIP loaders, feeding CLIP Text Encode into Sample's positive)
MODEL_INPUTS = ("model", "diffusion_model", "text_encoder_1", "text_encoder_2", "text_encoder_3", "vae", "checkpoint",
                "clip_name1", "clip_name2", "diffusion_model_2", "audio_vae")
# Inputs naming files or pictures the user supplies (LoRAs, ControlNets, Redux's files, Load Image's picture):
# building and exporting a workflow accepts any value there, as for MODEL_INPUTS
USER_FILE_INPUTS = ("lora_name", "controlnet_name", "image", "style_model_name", "clip_vision_name", "upscale_model",
                    "audio")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
                  "--no-default-browser-check", "--password-store=basic")


class ChromiumNotFound(RuntimeError):
    pass


class FrontendError(RuntimeError):
    """JavaScript failed in the page, or the frontend did not come up."""


def find_chromium() -> str | None:
    """settings.CHROMIUM, else Debian's chromium-headless-shell or chromium on PATH."""
    env = settings.CHROMIUM.raw()
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


# ---- the DevTools protocol
class Browser:
    """A headless Chromium process with a fresh profile, and one DevTools connection to it."""

    def __init__(self, binary: str | None = None, width: int = 1600, height: int = 1000):
        self.binary = binary or find_chromium()
        if not self.binary:
            raise ChromiumNotFound("no Chromium found: run scripts/ensure_chromium.sh (Debian's "
                                   "chromium-headless-shell) or set " + settings.CHROMIUM.name)
        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="comfyui-tpu-chromium-"))
        self.proc: subprocess.Popen | None = None
        self.ws: websocket.WebSocket | None = None
        self._ids = itertools.count(1)
        self.events: list[dict] = []  # DevTools events, oldest first (the pages read and clear theirs)

    def start(self, timeout: float = 30.0) -> Browser:
        log = open(self.profile / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise FrontendError(f"Chromium exited with code {self.proc.returncode}:\n{self.log_tail()}")
            lines = port_file.read_text().split() if port_file.exists() else []
            if len(lines) >= 2:
                break
            if time.monotonic() > deadline:
                self.close()
                raise FrontendError(f"Chromium did not open its DevTools port in {timeout:.0f} s")
            time.sleep(0.05)
        # suppress_origin: Chromium refuses DevTools websockets that send an Origin it does not allow.
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{lines[0]}{lines[1]}", timeout=timeout,
                                              suppress_origin=True, enable_multithread=False)
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.profile / "chromium.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        """Sends one DevTools command and returns its result; events that arrive meanwhile are kept."""
        msg_id = next(self._ids)
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"DevTools {method} did not answer in {timeout:.0f} s")
            self.ws.settimeout(left)
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise FrontendError(f"DevTools {method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)
                del self.events[:-2000]

    def new_page(self) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        return page

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.call("Browser.close", timeout=5)
            except Exception:
                pass
            self.ws.close()
            self.ws = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        return self.browser.call(method, params, self.session, timeout)

    def evaluate(self, expression: str, timeout: float = 60.0):
        """Runs JavaScript in the page (awaiting a promise) and returns its JSON value. DevTools' "Promise was
        collected" (V8 dropped the awaited promise: seen once in a run of the help-panel test, the page alive)
        gets one more try; any other error is raised."""
        params = {"expression": expression, "awaitPromise": True, "returnByValue": True, "userGesture": True}
        try:
            result = self.call("Runtime.evaluate", params, timeout)
        except FrontendError as e:
            if "Promise was collected" not in str(e):
                raise
            result = self.call("Runtime.evaluate", params, timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise FrontendError(f"JavaScript error: {text}")
        return result["result"].get("value")

    def call_js(self, function: str, *args, timeout: float = 60.0):
        """Calls a JavaScript (async) function expression with JSON arguments."""
        return self.evaluate(f"({function})(...{json.dumps(list(args))})", timeout)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def take_events(self) -> list[dict]:
        """The DevTools events of this page since the last call."""
        mine = [e for e in self.browser.events if e.get("sessionId") == self.session]
        self.browser.events[:] = [e for e in self.browser.events if e.get("sessionId") != self.session]
        return mine

    def screenshot(self, path: str | os.PathLike, clip: dict | None = None) -> Path:
        params = {"format": "png", "captureBeyondViewport": False}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        data = self.call("Page.captureScreenshot", params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


def console_problems(events: list[dict]) -> list[str]:
    """Uncaught exceptions and console.error lines among DevTools events."""
    out = []
    for e in events:
        if e["method"] == "Runtime.exceptionThrown":
            d = e["params"]["exceptionDetails"]
            out.append("uncaught: " + (d.get("exception", {}).get("description") or d.get("text", "")))
        elif e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error":
            out.append("console.error: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in e["params"]["args"]))
    return out


# ---- ComfyUI's frontend
_READY_JS = """() => !!(window.app && window.app.graph && window.app.canvas && window.LiteGraph
    && Object.keys(window.LiteGraph.registered_node_types).length > 0 && !document.querySelector('.p-progressspinner'))"""

# Loads a UI workflow the way opening a file does (without the dialogs), then reports what the frontend
# made of it: node types it does not know, and widget values it rejects, changes or cannot place.
_LOAD_JS = r"""async (wf, name) => {
  const LG = window.LiteGraph, app = window.app;
  const missing = [...new Set((wf.nodes || []).map(n => n.type).filter(t => !(t in LG.registered_node_types)))];
  // What the frontend tells the user while loading (a toast or an alert: e.g. a workflow that fails validation)
  const toast = app.extensionManager.toast, messages = [];
  toast.removeAll();
  const stop = toast.$onAction(({name, args}) => {
    if (name === 'addAlert') messages.push(`alert: ${args[0]}`);
    else if (name === 'add' && ['error', 'warn'].includes(args[0]?.severity))
      messages.push(`${args[0].severity}: ${args[0].summary ?? ''} ${args[0].detail ?? ''}`.trim());
  });
  try {
    await app.loadGraphData(wf, true, true, name,
                            {showMissingNodesDialog: false, showMissingModelsDialog: false});
    await new Promise(r => setTimeout(r, 50));
  } finally { stop(); }
  if (!app.graph.nodes.length) messages.push('the loaded graph has no nodes');
  const after = app.graph.serialize();
  const widgetErrors = [], unknownValues = [], outdated = [];
  for (const saved of wf.nodes || []) {
    if (missing.includes(saved.type)) continue;
    const node = app.graph.getNodeById(saved.id);
    const where = `node ${saved.id} (${saved.type})`;
    if (!node) { widgetErrors.push(`${where}: not in the loaded graph`); continue; }
    // widgets_values holds every widget that serializes, control_after_generate included (the prompt does not)
    const widgets = (node.widgets || []).filter(w => w.serialize !== false);
    const reloaded = after.nodes.find(other => other.id === saved.id)?.widgets_values;
    // a DOM widget that does not serialize its value still takes a slot in widgets_values (Load Audio's player:
    // null): the frontend's own count of the reloaded node is the right one, and those slots are not compared
    const slots = Math.max(widgets.length, Array.isArray(reloaded) ? reloaded.length : 0);
    const values = Array.isArray(saved.widgets_values) && slots > widgets.length
      ? saved.widgets_values.slice(0, widgets.length) : saved.widgets_values;
    const count = Array.isArray(values) ? values.length : 0;
    if (Array.isArray(saved.widgets_values) && saved.widgets_values.length > slots) {
      widgetErrors.push(`${where}: ${saved.widgets_values.length} saved widget values for ${slots} widgets ` +
                        `(${widgets.map(w => w.name).join(', ')}): the extra ones are lost`);
    } else if (count < widgets.length && Array.isArray(values)) {
      // Saved before the node gained inputs (new inputs only ever go last): they load with their defaults.
      outdated.push(`${where}: saved without ${widgets.slice(count).map(w => w.name).join(', ')} (defaults used)`);
    }
    const kept = Array.isArray(values) && Array.isArray(reloaded) ? reloaded.slice(0, count) : reloaded;
    const none = v => v == null || (Array.isArray(v) && !v.length);  // a node without widgets: [] or absent
    if (!(none(kept) && none(values)) && JSON.stringify(kept ?? null) !== JSON.stringify(values ?? null)) {
      widgetErrors.push(`${where}: the frontend changed the widget values from ${JSON.stringify(values)} ` +
                        `to ${JSON.stringify(reloaded)}`);
    }
    for (const w of widgets) {
      const opts = w.options || {};
      if (w.type === 'combo' && Array.isArray(opts.values) && !opts.values.includes(w.value)) {
        unknownValues.push({node: saved.id, type: saved.type, widget: w.name, value: w.value,
                            choices: opts.values.slice(0, 50)});
      } else if (w.type === 'number' && typeof w.value === 'number'
                 && ((opts.min !== undefined && w.value < opts.min) || (opts.max !== undefined && w.value > opts.max))) {
        widgetErrors.push(`${where}: ${w.name}=${w.value} is outside ${opts.min}..${opts.max}`);
      } else if (w.type === 'number' && typeof w.value !== 'number') {
        widgetErrors.push(`${where}: ${w.name}=${JSON.stringify(w.value)} is not a number`);
      }
    }
  }
  return {missing_nodes: missing, widget_errors: widgetErrors, unknown_values: unknownValues, messages,
          outdated};
}"""

_PROMPT_JS = """async () => { const p = await window.app.graphToPrompt(); return {output: p.output, workflow: p.workflow}; }"""

# Fits the view to the nodes (as a user would before saving or taking a screenshot) inside the part of the
# canvas that the side bar, the tab bar and the floating menus leave free, redraws, and returns that part.
_FIT_JS = r"""async (margin) => {
  const app = window.app, canvas = app.canvas, el = canvas.canvas;
  const side = document.querySelector('.side-tool-bar-container')?.getBoundingClientRect();
  const tabs = document.querySelector('.workflow-tabs-container')?.getBoundingClientRect();
  const box = {x: side ? side.right : 0, y: (tabs && tabs.height ? tabs.bottom : 0) + 56};
  box.width = el.clientWidth - box.x; box.height = el.clientHeight - box.y - 56;
  const nodes = app.graph.nodes;
  if (nodes.length) {
    let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
    for (const n of nodes) {
      const title = window.LiteGraph.NODE_TITLE_HEIGHT;
      x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - title);
      x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
    }
    const scale = Math.min(1.25, (box.width - 2 * margin) / (x1 - x0), (box.height - 2 * margin) / (y1 - y0));
    canvas.ds.scale = scale;
    canvas.ds.offset[0] = (box.x + box.width / 2) / scale - (x0 + x1) / 2;
    canvas.ds.offset[1] = (box.y + box.height / 2) / scale - (y0 + y1) / 2;
  }
  canvas.deselectAll?.();
  canvas.setDirty(true, true);
  canvas.draw(true, true);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return box;
}"""

# Builds a graph from a spec in the frontend (nodes created by type, widgets set by name, links by slot
# name), so the saved widgets_values come out in the frontend's own order.
_BUILD_JS = r"""async (spec) => {
  const LG = window.LiteGraph, app = window.app;
  await app.loadGraphData({last_node_id: 0, last_link_id: 0, nodes: [], links: [], groups: [], config: {},
                           extra: {}, version: 0.4}, true, true, spec.name || 'workflow');
  const graph = app.graph, byId = {};
  for (const n of spec.nodes) {
    const node = LG.createNode(n.type);
    if (!node) throw new Error(`unknown node type ${n.type}`);
    node.id = n.id;
    graph.add(node);
    if (node.id !== n.id) throw new Error(`node ${n.type} got id ${node.id}, wanted ${n.id}`);
    if (n.title) node.title = n.title;
    if (n.color) node.color = n.color;
    if (n.bgcolor) node.bgcolor = n.bgcolor;
    for (const [name, value] of Object.entries(n.widgets || {})) {
      const w = (node.widgets || []).find(w => w.name === name);
      if (!w) throw new Error(`${n.type} has no widget '${name}': ${(node.widgets || []).map(w => w.name)}`);
      w.value = value;
    }
    node.pos = n.pos;
    const min = node.computeSize();
    node.size = n.size ? [Math.max(n.size[0], min[0]), Math.max(n.size[1], min[1])] : min;
    byId[n.id] = node;
  }
  for (const [a, out, b, inp] of spec.links || []) {
    const src = byId[a], dst = byId[b];
    const o = typeof out === 'number' ? out : src.findOutputSlot(out);
    const i = typeof inp === 'number' ? inp : dst.findInputSlot(inp);
    if (o < 0 || i < 0) throw new Error(`cannot link ${a}.${out} -> ${b}.${inp}`);
    if (!src.connect(o, dst, i)) throw new Error(`the frontend refused the link ${a}.${out} -> ${b}.${inp}`);
  }
  graph.extra = {...(graph.extra || {}), ...(spec.extra || {})};
  return true;
}"""


# Opens the template browser (as its side-bar button does), picks a pack's entry and returns the texts shown.
_TEMPLATES_JS = r"""async (module) => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  await window.app.extensionManager.command.execute('Comfy.BrowseTemplates');
  const leaves = () => [...document.querySelectorAll('.p-dialog *')].filter(e => e.children.length === 0);
  let entry;
  for (let i = 0; i < 150 && !entry; i++) {
    entry = leaves().find(e => e.textContent.trim() === module);
    if (!entry) await sleep(100);
  }
  if (!entry) throw new Error(`the template browser has no entry '${module}'`);
  (entry.closest('button, a, li, [role=button]') || entry).click();
  // the browser shows 24 cards a page and loads the next when its end scrolls into view: scroll until no more come
  let shown = -1;
  for (let i = 0; i < 40; i++) {
    for (let j = 0; j < 50; j++) {
      await sleep(100);
      const imgs = [...document.querySelectorAll('.p-dialog img')];
      if (imgs.length && imgs.every(img => img.complete)) break;
    }
    const count = new Set(leaves().map(e => e.textContent.trim())).size;
    if (count === shown) break;
    shown = count;
    document.querySelectorAll('.p-dialog *').forEach(e => {
      if (e.scrollHeight > e.clientHeight + 1) e.scrollTop = e.scrollHeight;
    });
    await sleep(300);
  }
  return leaves().map(e => e.textContent.trim()).filter(Boolean);
}"""


@dataclass
class Conversion:
    """What the frontend made of a UI workflow: the API prompt and the problems it found while loading."""
    name: str
    prompt: dict
    missing_nodes: list[str] = field(default_factory=list)
    widget_errors: list[str] = field(default_factory=list)
    unknown_values: list[dict] = field(default_factory=list)  # combo values not offered (e.g. a model not here)
    messages: list[str] = field(default_factory=list)  # warnings and errors the frontend showed the user
    outdated: list[str] = field(default_factory=list)  # nodes saved before they gained inputs (not an error)
    console_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def problems(self, allowed_values: dict[str, set | None] | None = None) -> list[str]:
        """Missing nodes, widget errors, and combo values that are not offered, except those in
        `allowed_values` ({"widget name": {values}}, or None for any value: e.g. model names that are not
        installed where this runs)."""
        allowed_values = allowed_values or {}
        out = [f"missing node type: {t}" for t in self.missing_nodes] + list(self.widget_errors)
        out += [f"the frontend said: {m}" for m in self.messages]
        for u in self.unknown_values:
            allowed = allowed_values.get(u["widget"], ())
            if allowed is not None and u["value"] not in allowed:
                out.append(f"node {u['node']} ({u['type']}): {u['widget']}={u['value']!r} is not one of "
                           f"{u['choices']}")
        return out

    def check(self, allowed_values: dict[str, set | None] | None = None) -> Conversion:
        problems = self.problems(allowed_values)
        if problems:
            raise FrontendError(f"{self.name}: the frontend found problems:\n  " + "\n  ".join(problems))
        return self


class Frontend:
    """The web UI of a running ComfyUI server (anything with `.url`, or a URL) in headless Chromium."""

    def __init__(self, server, chromium: str | None = None, width: int = 1600, height: int = 1000):
        self.url = server if isinstance(server, str) else server.url
        self.browser = Browser(chromium, width, height)
        self.page: Page | None = None

    def start(self, timeout: float = 90.0) -> Frontend:
        # A new user gets the template browser on the first visit: mark the tutorial done, as that visit would.
        requests.post(f"{self.url}/settings/Comfy.TutorialCompleted", json=True, timeout=30).raise_for_status()
        self.browser.start()
        try:
            self.page = self.browser.new_page()
            # No "try Nodes 2.0" banner: it would cover the top of every screenshot.
            self.page.call("Page.addScriptToEvaluateOnNewDocument",
                           {"source": "localStorage.setItem('vueNodesBannerDismissed', 'true')"})
            self.open(self.url, timeout)
        except BaseException:
            self.browser.close()
            raise
        return self

    def open(self, url: str, timeout: float = 90.0) -> None:
        """Loads `url` (the UI, or the UI with a query such as ?template=...) and waits for the app."""
        self.page.navigate(url)
        deadline = time.monotonic() + timeout
        while not self.page.call_js(_READY_JS):
            if time.monotonic() > deadline:
                raise FrontendError(f"the ComfyUI frontend at {url} did not come up in {timeout:.0f} s: "
                                    f"{console_problems(self.page.take_events())[-10:]}")
            time.sleep(0.2)
        self.close_dialogs()
        self.page.take_events()

    def close(self) -> None:
        self.browser.close()

    def close_dialogs(self, timeout: float = 5.0) -> None:
        """Presses Escape if a dialog is open, and waits until it has gone."""
        open_dialogs = "document.querySelectorAll('.p-dialog, .p-dialog-mask').length"
        if not self.page.evaluate(open_dialogs):
            return
        for kind in ("keyDown", "keyUp"):
            self.page.call("Input.dispatchKeyEvent", {"type": kind, "key": "Escape", "code": "Escape",
                                                      "windowsVirtualKeyCode": 27})
        deadline = time.monotonic() + timeout
        while self.page.evaluate(open_dialogs) and time.monotonic() < deadline:
            time.sleep(0.1)

    def __enter__(self) -> Frontend:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- workflows
    def load(self, workflow: dict, name: str = "workflow") -> dict:
        """Opens a UI workflow like the user would; returns {missing_nodes, widget_errors, unknown_values,
        messages, outdated, console_errors}."""
        self.page.take_events()
        report = self.page.call_js(_LOAD_JS, workflow, name)
        report["console_errors"] = console_problems(self.page.take_events())
        return report

    def graph_to_prompt(self) -> dict:
        """The API prompt of the graph now open, from the frontend's own app.graphToPrompt()."""
        return self.page.call_js(_PROMPT_JS)["output"]

    def serialize(self) -> dict:
        """The graph now open in the UI format, as the frontend saves it (app.graph.serialize())."""
        return self.page.call_js("async () => window.app.graph.serialize()")

    def convert(self, workflow: dict, name: str = "workflow") -> Conversion:
        """UI workflow -> API prompt through the frontend, with what it found wrong on the way."""
        started = time.perf_counter()
        report = self.load(workflow, name)
        prompt = self.graph_to_prompt()
        return Conversion(name=name, prompt=prompt, seconds=time.perf_counter() - started, **report)

    def build(self, spec: dict) -> dict:
        """Builds a graph in the frontend from `spec` (see _BUILD_JS: nodes with widget values by name,
        links by slot name, extra) and returns it as the frontend saves it, view fitted to the nodes."""
        self.page.call_js(_BUILD_JS, spec)
        self.page.call_js(_FIT_JS, 60)
        return self.serialize()

    def template_browser(self, module: str) -> list[str]:
        """Opens ComfyUI's template browser on the entry of custom-node pack `module` (its folder name); returns
        the texts it shows (template titles among them). Escape (close_dialogs) closes it."""
        return self.page.call_js(_TEMPLATES_JS, module)

    def screenshot(self, workflow: dict | None, path: str | os.PathLike, margin: int = 30,
                   whole_page: bool = True) -> Path:
        """PNG of the UI with `workflow` loaded (None: the graph now open), the view fitted to its nodes;
        whole_page=False: only the free part of the canvas (no side bar, tab bar or menus)."""
        if workflow is not None:
            self.load(workflow)
        self.page.evaluate("window.app.extensionManager.toast.removeAll()")
        box = self.page.call_js(_FIT_JS, margin)
        time.sleep(0.3)  # let the frontend's DOM widgets (text areas) follow the canvas
        return self.page.screenshot(path, None if whole_page else box)


# ---- helpers
@contextlib.contextmanager
def open_frontend(comfyui_dir: str | None = None, models_dir: str | None = None, **frontend_kw):
    """A throwaway ComfyUI server with this pack (models from `models_dir`, default none) and its frontend.
    Enough to build, convert or photograph workflows: that needs the node definitions, not the models."""
    from comfy_server import ComfyServer

    comfyui_dir = comfyui_dir or os.environ.get("COMFYUI_DIR")
    if not comfyui_dir:
        raise RuntimeError("COMFYUI_DIR is not set: run `eval \"$(bash scripts/bootstrap.sh)\"` first")
    with tempfile.TemporaryDirectory(prefix="comfyui-tpu-frontend-") as tmp:
        models = models_dir or os.path.join(tmp, "models")
        os.makedirs(models, exist_ok=True)
        with ComfyServer(comfyui_dir, models, work_dir=os.path.join(tmp, "server")) as server, \
                Frontend(server, **frontend_kw) as ui:
            yield server, ui


def workflow_files(folder: str | os.PathLike) -> list[Path]:
    """The UI-format workflows of a folder (its *.json files, top level only, as ComfyUI lists templates)."""
    return sorted(p for p in Path(folder).glob("*.json") if not p.name.startswith("."))


def load_ui_workflow(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text())


def substitute_models(prompt: dict, models: dict[str, str]) -> dict:
    """A copy of an API prompt with its model and model-file inputs (MODEL_INPUTS) renamed through `models`
    (e.g. to tiny models)."""
    prompt = json.loads(json.dumps(prompt))
    for node in prompt.values():
        inputs = node.get("inputs", {})
        for name in MODEL_INPUTS:
            if isinstance(inputs.get(name), str) and inputs[name] in models:
                inputs[name] = models[inputs[name]]
    return prompt


def run_workflow(server, conversion: Conversion | dict, models: dict[str, str] | None = None,
                 timeout: float = 300.0) -> dict:
    """Queues a converted workflow on `server` (a ComfyServer), model names substituted; see ComfyServer.run."""
    prompt = conversion.prompt if isinstance(conversion, Conversion) else conversion
    return server.run(substitute_models(prompt, models or {}), timeout=timeout)
