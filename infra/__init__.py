"""The platform the record stands on, knowing nothing of it: configuration (``conf``, ``env``),
the error vocabulary every layer raises (``errors``), identifiers, hashing, JSON text, durations
and keyset pagination; outbound requests (``outbound``, ``deadline``, ``signing``), the request
throttle, and observability (``metrics``, ``metrics_endpoint``, ``tracing``, ``telemetry``).
Nothing here imports ``ledger``, ``recovery`` or the apps above them."""
