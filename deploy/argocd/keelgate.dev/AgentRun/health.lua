-- Argo CD health of a keelgate.dev AgentRun (docs/gitops.md says what each state means).
-- Argo CD runs it without the string library: base and table functions only.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local function text(value)
  return value ~= nil and value ~= ""
end

-- "reason: message", or whichever of the two there is.
local function explain(reason, message, fallback)
  if text(reason) and text(message) then
    return reason .. ": " .. message
  end
  if text(message) then
    return message
  end
  if text(reason) then
    return reason
  end
  return fallback
end

-- A monitor's tick carries the monitor's spec (loop: monitor) but runs like any run.
local function isTick(meta)
  if meta.labels == nil or meta.labels["keelgate.dev/monitor"] == nil then
    return false
  end
  for _, ref in ipairs(meta.ownerReferences or {}) do
    if ref.kind == "AgentRun" and ref.controller == true then
      return true
    end
  end
  return false
end

local spec = obj.spec or {}
local status = obj.status
if status == nil or not text(status.phase) then
  hs.status = "Progressing"
  hs.message = "Waiting for the Keelgate operator to pick up the run"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Keelgate operator to act on generation " .. generation
    .. " (status is of generation " .. status.observedGeneration .. ")"
  return hs
end

local stalled = condition(status, "Stalled")
if isTrue(stalled) or status.phase == "Failed" then
  hs.status = "Degraded"
  local message = status.message
  if stalled ~= nil and text(stalled.message) then
    message = stalled.message
  end
  hs.message = explain(status.stopReason, message, "Stalled")
  return hs
end

if spec.loop == "monitor" and not isTick(obj.metadata) then
  if spec.suspend == true then
    hs.status = "Suspended"
    hs.message = explain(nil, status.message, "spec.suspend is true")
  else
    hs.status = "Healthy"
    hs.message = explain(nil, status.message, "Scheduling ticks")
  end
  return hs
end

if status.phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = explain(status.stopReason, status.message, "goal met")
  -- A WRITE a person denied never ran: the run says so beside its goal.
  local denied = condition(status, "Denied")
  if isTrue(denied) then
    hs.message = hs.message .. " (" .. explain(nil, denied.message, "an action was denied") .. ")"
  end
  return hs
end

-- Another cluster's operator holds the run in the store (a standby cluster): at rest here, not
-- failed and not under way; its message names the cluster that drives it.
local standby = condition(status, "Standby")
if isTrue(standby) then
  hs.status = "Suspended"
  hs.message = explain("Standby", standby.message, "")
  return hs
end

local reconciling = condition(status, "Reconciling")
if isTrue(reconciling) then
  hs.status = "Progressing"
  local step = status.step or {}
  local running = "A step is under way"
  if step.number ~= nil and text(step.pod) then
    running = "Step " .. step.number .. " is under way (pod " .. step.pod .. ")"
  end
  hs.message = explain(nil, reconciling.message, running)
  return hs
end

if spec.suspend == true then
  hs.status = "Suspended"
  hs.message = explain(nil, status.message, "spec.suspend is true")
  return hs
end

local unknown = condition(status, "OutcomeUnknown")
if isTrue(unknown) then
  hs.status = "Suspended"
  hs.message = explain("A write's outcome is unknown; settle each Reconciliation", unknown.message, "")
  return hs
end

local approval = condition(status, "AwaitingApproval")
if isTrue(approval) then
  hs.status = "Suspended"
  hs.message = explain("Waiting for approval; decide each Approval", approval.message, "")
  return hs
end

if status.phase == "Stopped" and status.resumable == true then
  hs.status = "Suspended"
  hs.message = explain(status.stopReason, status.message, "Stopped")
    .. " (change the spec, e.g. raise spec.budget, to continue)"
  return hs
end

if status.phase == "Pending" or status.phase == "Running" then
  hs.status = "Progressing"
  hs.message = explain(nil, status.message, status.phase)
  return hs
end

hs.status = "Unknown"
hs.message = explain(status.stopReason, status.message, "phase " .. status.phase)
return hs
