"""Code a worker serves: a backend whose entrypoint is a function, a callable class or an ASGI
application (``entry``), answered by the replica's own HTTP server (``server``) over the
ingress's HTTP/1.1 (``_http``): the request a handler reads (``request``), what it may return
(``response``), how it is called (``calls``) and answered (``outgoing``), and ASGI (``asgi``).
LocalRuntime's worker, Ray's replica actor and the test kit's FakeRuntime all run it."""
