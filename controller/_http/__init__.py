"""HTTP/1.1 on raw non-blocking sockets, served the way the ingress serves it: llhttp framing
with one set of smuggling rules (``framing``, ``answers``), one task a connection with one
deadline at a time (``connection``, ``timers``), one epoll watch for clients that hang up
(``hangups``), admission by counts (``admission``), and the accept loop (``server``). The ingress
and a replica's own server (``_serving``) are two handlers over it: not two HTTP stacks."""
