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

if status.phase == "Settled" then
  hs.status = "Healthy"
  hs.message = "Settled: " .. what .. " " .. (status.verdict or "?") .. " by "
    .. (status.settledBy or "?")
  return hs
end

-- The operator could not act on the decision (refused by the loop, or no such run in the store):
-- it says why in status.message and keeps trying, but a person must look.
if status.phase == "Pending" and status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Stalled" and c.status == "True" then
      hs.status = "Degraded"
      hs.message = (c.reason or "Stalled") .. ": " .. (status.message or c.message or "?")
      return hs
    end
  end
end

if status.phase == "Pending" and spec.approved ~= nil then
  hs.status = "Progressing"
  hs.message = (spec.by or "?") .. " decided approved: " .. tostring(spec.approved)
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
