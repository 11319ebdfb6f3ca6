"""docs/notifications.md holds against the code and the chart, without a cluster or Alertmanager.

The event catalogue in the docs is the code's (and the chart's schema allows exactly it), and the
documented Alertmanager route has the shape Alertmanager reads: every key is one of its
configuration file's (as its config package declares them: the top level, a route, a receiver, a
Slack config), the route's matcher takes each alert the chart's PrometheusRule ships, and its
templates read only annotations those alerts carry. Alertmanager itself (``amtool check-config``)
is not run: it is not installed here, and only its documented keys are checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from keelgate.manifest.notifications import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "notifications.md").read_text()
RULES = (ROOT / "charts" / "keelgate" / "templates" / "monitoring.yaml").read_text()

# Alertmanager's configuration file (prometheus/alertmanager config/config.go, notifiers.go).
TOP = {
    "global",
    "route",
    "inhibit_rules",
    "receivers",
    "templates",
    "time_intervals",
    "mute_time_intervals",
}
ROUTE = {
    "receiver",
    "group_by",
    "match",
    "match_re",
    "matchers",
    "mute_time_intervals",
    "active_time_intervals",
    "continue",
    "routes",
    "group_wait",
    "group_interval",
    "repeat_interval",
}
RECEIVER_CONFIGS = {
    "discord_configs",
    "email_configs",
    "incidentio_configs",
    "pagerduty_configs",
    "slack_configs",
    "webhook_configs",
    "opsgenie_configs",
    "wechat_configs",
    "pushover_configs",
    "victorops_configs",
    "sns_configs",
    "telegram_configs",
    "webex_configs",
    "msteams_configs",
    "msteamsv2_configs",
    "jira_configs",
    "rocketchat_configs",
    "mattermost_configs",
}
SLACK = {
    "send_resolved",
    "http_config",
    "api_url",
    "api_url_file",
    "channel",
    "username",
    "color",
    "title",
    "title_link",
    "pretext",
    "text",
    "fields",
    "short_fields",
    "footer",
    "fallback",
    "callback_id",
    "icon_emoji",
    "icon_url",
    "image_url",
    "thumb_url",
    "link_names",
    "mrkdwn_in",
    "actions",
    "edit_messages",
}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def _alertmanager_config() -> dict[str, Any]:
    block = re.search(r"```yaml\n# alertmanager\.yml\n(.*?)```", DOC, re.S)
    assert block is not None, "the Alertmanager block is gone from docs/notifications.md"
    config = yaml.safe_load(block.group(1))
    assert isinstance(config, dict)
    return config


def _routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    return [route, *(r for child in route.get("routes") or [] for r in _routes(child))]


def _chart_alerts() -> dict[str, set[str]]:
    """Each alert of the chart's PrometheusRule, with the annotations it carries."""
    alerts: dict[str, set[str]] = {}
    for chunk in re.split(r"\n\s*- alert: ", RULES)[1:]:
        name = chunk.split()[0]
        notes = chunk.split("annotations:", 1)[1]
        alerts[name] = set(re.findall(r"^\s{12}([a-z]+):", notes, re.M))
    return alerts


def test_the_documented_alertmanager_route_has_alertmanagers_shape() -> None:
    """Every key of the documented config is one Alertmanager reads, each route names a
    receiver that is defined, durations and matchers are in Alertmanager's syntax, and the
    Slack receiver reads its webhook from a file (no secret in the config)."""
    config = _alertmanager_config()
    assert set(config) <= TOP, set(config) - TOP
    names = [r["name"] for r in config["receivers"]]
    assert len(names) == len(set(names))
    for receiver in config["receivers"]:
        assert set(receiver) <= {"name"} | RECEIVER_CONFIGS, receiver
        for slack in receiver.get("slack_configs") or []:
            assert set(slack) <= SLACK, set(slack) - SLACK
            assert "api_url_file" in slack and "api_url" not in slack
    for route in _routes(config["route"]):
        assert set(route) <= ROUTE, set(route) - ROUTE
        assert route.get("receiver", "default") in names
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route:
                assert DURATION.match(str(route[key])), (key, route[key])
        for matcher in route.get("matchers") or []:
            assert MATCHER.match(matcher), matcher


def test_the_documented_route_takes_every_alert_of_the_chart_and_reads_what_they_carry() -> None:
    """The route's matcher takes each of the chart's alerts (a renamed alert would slip past the
    chat channel), and its message templates read only annotations every alert has."""
    config = _alertmanager_config()
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "keelgate-chat"]
    (matcher,) = [MATCHER.match(m) for m in route["matchers"] if m.startswith("alertname")]
    assert matcher is not None and matcher.group(2) == "=~"
    alerts = _chart_alerts()
    assert set(alerts) == {
        "KeelgateDecisionWaiting",
        "KeelgateReconcileErrors",
        "KeelgateStepPodCapSaturated",
        "KeelgateNoLeader",
    }
    for name in alerts:
        assert re.fullmatch(matcher.group(3), name), name
    (receiver,) = [r for r in config["receivers"] if r["name"] == "keelgate-chat"]
    used = set(re.findall(r"Annotations\.([a-z]+)", json.dumps(receiver)))
    assert used
    for name, notes in alerts.items():
        assert used <= notes, (name, used - notes)


def test_the_documented_catalogue_is_the_code_and_the_charts() -> None:
    """The event types the docs list are the operator's catalogue, and the chart's values
    schema allows exactly them in a sink's types."""
    documented = set(re.findall(r"^\| `(dev\.keelgate\.[a-z.]+)` \|", DOC, re.M))
    assert documented == set(EVENT_TYPES)
    schema = json.loads((ROOT / "charts" / "keelgate" / "values.schema.json").read_text())
    sink = schema["properties"]["notifications"]["properties"]["sinks"]["items"]
    assert set(sink["properties"]["types"]["items"]["enum"]) == set(EVENT_TYPES)
