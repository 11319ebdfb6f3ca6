-- Argo CD health of a keelgate.dev Approval (docs/gitops.md says what each state means).
-- Argo CD runs it without the string library: base and table functions only.
local hs = {}
local spec = obj.spec or {}
local status = obj.status
local what = (spec.tool or "?") .. " (" .. (spec.action or "?") .. ") of run " .. (spec.runName or "?")

if status == nil or status.phase == nil or status.phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the Keelgate operator to show it Pending"
  return hs
end

-- The object's condition of a type ({} when it shows none).
local function condition(kind)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return {}
end

-- Asked afresh: no approval on it could count any more, and the action waits on a new Approval
-- (its round's), which carries the wait; this one is done, kept for audit.
if status.phase == "Settled" and status.verdict == "expired" then
  hs.status = "Healthy"
  hs.message = "Expired: " .. what .. " is asked afresh as approval "
    .. (status.askedAgainAs or "?") .. " (no approval on this one counts)"
  return hs
end

if status.phase == "Settled" then
  hs.status = "Healthy"
  hs.message = "Settled: " .. what .. " " .. (status.verdict or "?") .. " by "
    .. (status.settledBy or "?")
  -- The count the verdict met, as the object shows it ("2 of 2"), for a rule of several.
  if status.verdict == "approved" and status.required ~= nil and status.required > 1 then
    hs.message = hs.message .. " (" .. (status.progress or "?") .. ")"
  end
  return hs
end

-- The operator could not act on the decision (refused by the loop, or no such run in the store):
-- it says why in status.message and keeps trying, but a person must look.
local stalled = condition("Stalled")
if status.phase == "Pending" and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = (stalled.reason or "Stalled") .. ": " .. (status.message or stalled.message or "?")
  return hs
end

-- A decision the operator will not count (not in the rule's groups, the run's creator, a
-- ServiceAccount; the Ready condition's reason says NotCounted): the action still waits for
-- people, and the operator's message says who was not counted and why.
if status.phase == "Pending" and condition("Ready").reason == "NotCounted" then
  hs.status = "Suspended"
  hs.message = "Waiting for people, a decision not counted: " .. what .. ": "
    .. (status.message or "?")
  return hs
end

-- A decision in spec the operator has not recorded yet (more entries than it has recorded; an
-- older operator's status has no count, and then only the one-decision form is told).
local entries = 0
local last = nil
if spec.approved ~= nil then
  entries = 1
  last = { by = spec.by, approved = spec.approved }
end
for _, d in ipairs(spec.decisions or {}) do
  entries = entries + 1
  last = d
end
local recorded = status.decided
if recorded == nil and spec.approved ~= nil then
  recorded = 0
end
if status.phase == "Pending" and last ~= nil and recorded ~= nil and entries > recorded then
  hs.status = "Progressing"
  hs.message = (last.by or "?") .. " decided approved: " .. tostring(last.approved)
    .. "; waiting for the Keelgate operator to record it for " .. what
  return hs
end

-- A rule asking several people: how many approvals count so far, and what it asks.
if status.phase == "Pending" and status.required ~= nil and status.required > 1 then
  hs.status = "Suspended"
  hs.message = "Waiting for people: " .. (status.progress or "?") .. " approvals of " .. what
    .. " (" .. (status.asks or "?") .. "; each adds a decision to spec.decisions)"
  return hs
end

if status.phase == "Pending" then
  hs.status = "Suspended"
  hs.message = "Waiting for a person: approve or deny " .. what
    .. " (set spec.approved to true or false, and spec.by)"
  return hs
end

hs.status = "Unknown"
hs.message = "phase " .. status.phase
return hs
