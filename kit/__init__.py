"""The base every process of tool-dispatcher stands on, the relay's included: what a
long-running process needs whatever it does, and nothing about outboxes or tool calls.

- :mod:`kit.telemetry`: the tracer provider and W3C trace context in stored text;
- :mod:`kit.logs`: the log format (text, or one JSON object per line);
- :mod:`kit.signals`: stopping on SIGTERM/SIGINT, and the sleep a loop takes between
  steps, cut short by a stop;
- :mod:`kit.periodic`: a step every so often until stopped, surviving its errors;
- :mod:`kit.owners`: the one name a process gives itself on what it leases;
- :mod:`kit.cli`: one-line command-line errors (exit 2), for every command;
- :mod:`kit.crashpoints`: named kill -9 points, armed by a setting, for crash tests;
- :mod:`kit.kafka`: closing a Kafka consumer all the way, even as its broker goes away.

The lowest layer: it imports none of the service's packages.
"""
