"""router/pd/serve_calls.py: a handle call made inside `own_request_id()` carries an internal
request id of its own; the request id (what logs show) and the rest of the context stay."""

from __future__ import annotations

from ray.serve import context

from router.pd.serve_calls import own_request_id, remote


def test_each_call_gets_its_own_internal_id_and_keeps_the_rest():
    context._set_request_context(route="/v1/completions", request_id="client-1", _internal_request_id="proxy-1",
                                 app_name="tandem")
    try:
        seen = []
        for _ in range(3):
            with own_request_id():
                seen.append(context._get_serve_request_context())
        after = context._get_serve_request_context()
    finally:
        context._unset_request_context()
    ids = [c._internal_request_id for c in seen]
    assert len(set(ids)) == 3 and "proxy-1" not in ids
    assert all((c.request_id, c.route, c.app_name) == ("client-1", "/v1/completions", "tandem") for c in seen)
    assert after._internal_request_id == "proxy-1"  # restored on the way out


def test_remote_makes_the_call_inside_its_own_id():
    class Method:  # a handle method: .remote() reads the context when called
        def remote(self, *args):
            return args, context._get_serve_request_context()._internal_request_id

    context._set_request_context(request_id="client-1", _internal_request_id="proxy-1")
    try:
        (args, first), (_, second) = remote(Method(), 1, "x"), remote(Method())
        after = context._get_serve_request_context()._internal_request_id
    finally:
        context._unset_request_context()
    assert args == (1, "x") and len({first, second, "proxy-1"}) == 3 and after == "proxy-1"
