const r = await fetch("/api/health"); const h = await r.json(); document.getElementById("model").textContent = "Model: " + (h.model.label || h.model.name);
