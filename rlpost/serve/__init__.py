"""``rlpost serve``: a training service speaking the Tinker API, so that the official
``tinker`` SDK and the recipes written against it train on your own machine, many
LoRA tenants on one base model (docs/serve.md).

``app`` is the HTTP server, ``host`` the base model and its tenants (one worker
thread each), ``losses`` the loss functions by the SDK's names, ``wire`` the
protobuf messages."""
