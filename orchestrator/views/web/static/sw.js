// The device page's service worker (served as /sw.js with VERSION and PRECACHE above this line): the
// page, the SDK bundle and onnxruntime-web's WebAssembly are kept from the first visit on, so a later
// visit loads them from here (nothing from the server) and the page opens offline. The run's state
// (/web.json, /budget.json) comes from the server while it answers, else from the last copy; the
// status, a device's rounds and the websocket are never cached.
const CACHE = `edgetrain-${VERSION}`;
const KEPT = /^\/(sdk|static|shard)\//; // the same bytes until the version changes: the cache answers
const FRESH = new Set(["/", "/index.html", "/web.json", "/budget.json"]); // the server first, else the last copy

self.addEventListener("install", (event) => {
  event.waitUntil(precache().then(() => self.skipWaiting()));
});

/** Keep every PRECACHE file, or fail the install saying which file and why to the pages (they log it and
 * register again): a failed install leaves nothing active, so the pages would not know otherwise. */
async function precache() {
  const cache = await caches.open(CACHE);
  try {
    await Promise.all(PRECACHE.map(async (url) => {
      let response;
      try {
        response = await fetch(url);
      } catch (exc) {
        throw new Error(`${url}: ${exc}`);
      }
      if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
      await cache.put(url, response).catch((exc) => { throw new Error(`${url}: ${exc.name}: ${exc.message}`); });
    }));
  } catch (exc) {
    const pages = await self.clients.matchAll({ includeUncontrolled: true, type: "window" });
    for (const page of pages) page.postMessage({ type: "install-failed", error: String(exc.message ?? exc) });
    throw exc;
  }
}

self.addEventListener("activate", (event) => {
  event.waitUntil(caches.keys()
    .then((names) => Promise.all(names.filter((n) => n.startsWith("edgetrain-") && n !== CACHE).map((n) => caches.delete(n))))
    .then(() => self.clients.claim()));
});

async function cacheFirst(request) {
  const cache = await caches.open(CACHE);
  const hit = await cache.match(request, { ignoreSearch: true });
  if (hit) return hit;
  const response = await fetch(request);
  if (response.ok) await cache.put(request, response.clone());
  return response;
}

async function networkFirst(request, key) {
  const cache = await caches.open(CACHE);
  try {
    const response = await fetch(request);
    if (response.ok) await cache.put(key, response.clone());
    return response;
  } catch (offline) {
    const hit = await cache.match(key);
    if (hit) return hit;
    throw offline;
  }
}

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || url.origin !== location.origin) return;
  if (KEPT.test(url.pathname)) event.respondWith(cacheFirst(event.request));
  else if (FRESH.has(url.pathname)) {
    // The page under any query (?id=...&autostart=1) is the page; a budget is kept per sample count.
    const key = url.pathname === "/budget.json" ? url.pathname + url.search : url.pathname === "/web.json" ? "/web.json" : "/";
    event.respondWith(networkFirst(event.request, key));
  }
});
