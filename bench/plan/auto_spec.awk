# auto_spec.awk: rewrites a spec of schedules/ for the plan benchmarks
# (docs/performance.md, section on `mfsdpc plan`): every unit `layout auto`,
# declared layouts dropped (tensor overrides become the built-in ddp), no
# bucket_size, the mesh given as -v mesh="...".
/^layout [a-z_0-9]+ \{/ { skip = 1; next }
skip && /^\}/ { skip = 0; next }
skip { next }
/^mesh / { print "mesh " mesh ";"; next }
/^bucket_size/ { next }
/^unit / { sub(/ layout [a-z_0-9]+ \{/, " layout auto {") }
{ gsub(/ layout (replicated_norms|replicated);/, " layout ddp;"); print }
