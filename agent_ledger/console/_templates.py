# ruff: noqa: E501 (HTML lines read better whole)
"""The console's pages (Jinja2, autoescaped): server-rendered, no JavaScript, and
readable on a phone (one column, a viewport, no fixed widths)."""

from __future__ import annotations

from typing import Final

BASE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}agent-ledger{% endblock %} · agent-ledger</title>
<style>
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem;line-height:1.4}
header{display:flex;justify-content:space-between;flex-wrap:wrap;gap:.5rem;
border-bottom:1px solid #ccc;margin-bottom:1rem}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.4rem;
border-bottom:1px solid #eee;vertical-align:top}
code{word-break:break-all}
pre{background:#f6f6f6;padding:.75rem;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
.notice{padding:.75rem;border-radius:.3rem;background:#eef}
.refused{background:#fee}.accepted{background:#efe}
form.decide{display:flex;flex-direction:column;gap:.5rem;max-width:30rem}
button{font-size:1rem;padding:.6rem 1rem}textarea{font-size:1rem}
@media (max-width:40rem){th.wide,td.wide{display:none}}
</style></head><body>
<header><strong><a href="{{ root }}/">agent-ledger approvals</a></strong>
{% if principal %}<span>signed in as {{ principal }}</span>{% endif %}</header>
{% block body %}{% endblock %}
</body></html>
"""

PENDING: Final = """{% extends "base" %}{% block title %}Pending decisions{% endblock %}
{% block body %}<h1>Pending decisions</h1>
{% if not rows %}<p>Nothing waits for a person.</p>{% else %}
<table><thead><tr><th>Tool</th><th>Workflow</th><th>Reason</th><th>Waiting</th>
<th class="wide">Asked by</th></tr></thead><tbody>
{% for row in rows %}<tr>
<td><a href="{{ root }}/effects/{{ row.effect.idem_key }}">{{ row.effect.tool }}</a></td>
<td><a href="{{ root }}/workflows/{{ row.effect.workflow_id | urlencode }}">{{ row.effect.workflow_id }}</a></td>
<td>{{ row.reason }}</td><td>{{ row.waiting }}</td>
<td class="wide">{{ row.asked_by }}</td></tr>{% endfor %}
</tbody></table>{% endif %}{% endblock %}
"""

RECEIPT: Final = """{% extends "base" %}{% block title %}{{ effect.tool }}{% endblock %}
{% block body %}<h1>{{ effect.tool }}</h1>
{% if message %}<p class="notice {{ 'accepted' if accepted else 'refused' }}">{{ message }}</p>{% endif %}
<table>
<tr><th>Status</th><td>{{ effect.status.value }}</td></tr>
<tr><th>Workflow</th><td><a href="{{ root }}/workflows/{{ effect.workflow_id | urlencode }}">{{ effect.workflow_id }}</a></td></tr>
<tr><th>Reason</th><td>{{ reason }}</td></tr>
<tr><th>Asked by</th><td>{{ asked_by }}</td></tr>
{% if request and request.policy_version %}<tr><th>Policy</th><td>{{ request.policy_version }}</td></tr>{% endif %}
{% if request and request.deadline_at %}<tr><th>Deadline</th><td>{{ request.deadline_at }}</td></tr>{% endif %}
<tr><th>Attempt</th><td>{{ effect.attempt }} (ran {{ effect.executions }} time(s))</td></tr>
{% if effect.decided_by %}<tr><th>Decided</th><td>by {{ effect.decided_by }} at {{ effect.decided_at }}</td></tr>{% endif %}
<tr><th>Key</th><td><code>{{ effect.idem_key }}</code></td></tr>
<tr><th>Intent</th><td><code>{{ intent }}</code></td></tr>
</table>
<h2>Arguments, exactly as they will run</h2>
<pre id="args">{{ args }}</pre>
{% if effect.error %}<h2>Why it waits</h2><pre>{{ effect.error.message }}</pre>{% endif %}
{% if can_decide %}<h2>Decide</h2>
<form class="decide" method="post" action="{{ root }}/effects/{{ effect.idem_key }}/decide">
<input type="hidden" name="csrf" value="{{ csrf }}">
<input type="hidden" name="intent" value="{{ intent }}">
<label>Note <textarea name="note" rows="2" maxlength="2000"></textarea></label>
<button name="action" value="approve">Approve</button>
<button name="action" value="deny">Deny</button>
{% if effect.parked %}<label>Outcome seen downstream (JSON)
<textarea name="result" rows="2"></textarea></label>
<button name="action" value="resolve">Resolve as succeeded</button>{% endif %}
</form>{% elif effect.status.value == 'requires_approval' %}
<p>You may not decide {{ effect.tool }}.</p>{% endif %}
<h2>History</h2>{% if history %}<pre>{{ history }}</pre>{% else %}<p>None yet.</p>{% endif %}
<h2>Decision attempts</h2>{% if attempts %}<table>
{% for a in attempts %}<tr><td>{{ a.at }}</td><td>{{ a.principal }}</td><td>{{ a.channel.value }}</td>
<td>{{ a.action.value }}</td><td>{{ a.outcome.value }}</td><td>{{ a.reason_code.value }}</td></tr>
{% endfor %}</table>{% else %}<p>None yet.</p>{% endif %}
{% endblock %}
"""

WORKFLOW: Final = """{% extends "base" %}{% block title %}{{ workflow_id }}{% endblock %}
{% block body %}<h1>Workflow {{ workflow_id }}</h1>
{% if saga %}<p>Saga: {{ saga.status.value }}{% if saga.error %} ({{ saga.error.message }}){% endif %}.</p>{% endif %}
{% if not entries %}<p>No effects recorded for this workflow.</p>{% else %}
<table><thead><tr><th>When</th><th>What</th><th>Tool</th><th>Status</th><th>Usage</th></tr></thead><tbody>
{% for row in entries %}{% set e = row.effect %}<tr><td>{{ row.at.strftime('%H:%M:%S') }}</td>
{% if row.step %}<td>saga step {{ row.step.position + 1 }}</td>
<td>{% if e %}<a href="{{ root }}/effects/{{ e.idem_key }}">{{ row.step.tool }}</a>{% else %}{{ row.step.tool }}{% endif %}{% if row.step.compensation %}<br>undo: {% if row.undo %}<a href="{{ root }}/effects/{{ row.undo.idem_key }}">{{ row.step.compensation }}</a> ({{ row.undo.status.value }}){% else %}{{ row.step.compensation }} (not run){% endif %}{% endif %}</td>
<td>{% if e %}{{ e.status.value }}{% else %}not recorded{% endif %}</td><td></td>
{% else %}<td>{{ row.kind }}</td>
<td><a href="{{ root }}/effects/{{ e.idem_key }}">{{ e.tool }}</a></td><td>{{ e.status.value }}</td>
<td>{% if e.usage %}{{ e.usage.input_tokens }} in / {{ e.usage.output_tokens }} out{% if e.usage.cost_usd is not none %}, ${{ '%.4f' % e.usage.cost_usd }}{% endif %}{% endif %}</td>{% endif %}</tr>
{% endfor %}</tbody></table>{% endif %}{% endblock %}
"""

LINK: Final = """{% extends "base" %}{% block title %}Confirm{% endblock %}
{% block body %}<h1>{{ link.action.value | capitalize }} {{ effect.tool }}?</h1>
<p>For {{ link.principal }}, in workflow {{ effect.workflow_id }}.</p>
<pre id="args">{{ args }}</pre>
<form class="decide" method="post">
<input type="hidden" name="csrf" value="{{ csrf }}">
<label>Note <textarea name="note" rows="2" maxlength="2000"></textarea></label>
<button>Confirm: {{ link.action.value }}</button></form>{% endblock %}
"""

MESSAGE: Final = """{% extends "base" %}{% block title %}{{ title }}{% endblock %}
{% block body %}<h1>{{ title }}</h1><p class="notice {{ css }}">{{ message }}</p>{% endblock %}
"""

TEMPLATES: Final = {
    "base": BASE,
    "pending": PENDING,
    "receipt": RECEIPT,
    "workflow": WORKFLOW,
    "link": LINK,
    "message": MESSAGE,
}
