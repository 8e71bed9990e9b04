"""The web dashboard (`conveyor ui`): runs, DAGs and dead letters in a browser, live.

How it is built, and why: the standard library's `ThreadingHTTPServer` (server.py) in front
of one function from `Request` to `Response` (app.py, `Dashboard.handle`), a tiny router
(http.py), HTML rendered on the server with small functions (html.py), one hand-written
script and one stylesheet (static/). No framework, no new dependency, no build step, no CDN:
it works offline and has nothing to keep up to date but itself. Idle, it costs a blocked
`select()`; an open page polls the JSON API (every 2 s, only while visible) and swaps in
fresh content when the data changed.

Layering: `conveyor.ui` sits above `conveyor.readers` (the rows the CLI prints too: reuse
them, or move a CLI reader there, never copy one) and below `conveyor.cli`, whose `ui`
command and `up` start it.

How to add a page (say "Workers", in `conveyor/ui/pages/workers.py`)
--------------------------------------------------------------------
1. Write the module with a `register(ui)` that adds its link and routes::

       def register(ui: Dashboard) -> None:
           ui.add_nav("Workers", "/workers")
           ui.router.add("GET", "/workers", workers_page)
           ui.router.add("GET", "/api/workers", workers_api)

   A path pattern's `{name}` matches one segment and is passed by name:
   `ui.router.add("GET", "/api/workers/{worker_id}", one_worker)` calls
   `one_worker(ui, request, worker_id="…")`.
2. The JSON endpoint returns data (what a script reads; document it in the README's
   Dashboard section)::

       def workers_api(ui: Dashboard, request: Request) -> Response:
           with ui.store() as store:             # pooled; ui.broker(), ui.limiter()
               return Response.json({"workers": worker_rows(store, time.time())})

3. The page renders HTML with `conveyor.ui.html` (`e()` escapes every value from data;
   `table`, `badge`, `when`, `seconds`, `url`, `seg`, `action_form`) and names its JSON
   endpoint as `poll`, so it refreshes itself while open::

       def workers_page(ui: Dashboard, request: Request) -> Response:
           with ui.store() as store:
               rows = worker_rows(store, time.time())
           body = "<h1>Workers</h1>" + table(["host", "pid"], ([e(w["host"]), e(w["pid"])]
                                                              for w in rows))
           return ui.page(request, "Workers", body, active="/workers", poll="/api/workers")

4. Add the module to `PAGES` in app.py (one line each: the order is the navigation's).
5. An action (it changes state) is a POST route added with `action=True`:
   `ui.router.add("POST", "/api/workers/{worker_id}/drain", drain, action=True)`. The token
   and same-origin checks run before the handler (auth.py); return
   `Response.json({"message": "…"})`. In a page, `action_form(path, label, fields=…,
   confirm=…)` makes the button; app.js posts it with the token and refreshes the content.
6. Raise `HttpError(status, message)` for a request you refuse (404 for a missing id, 400
   for a bad argument): pages show it, the API returns `{"error": message}`.
7. Test it in the browser: tests/e2e/test_dashboard.py has the `dashboard` fixture (a
   server over a real store, and a Chromium page) and saves a screenshot of each page.
"""
