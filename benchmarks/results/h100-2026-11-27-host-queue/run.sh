#!/bin/bash
# The exact command run on the lent H100 (2026-11-27, run tool): the script, then two runs.
cat > /tmp/q.py <<'EOF'
import torch,time,statistics as st,sys
o=open(sys.argv[1],"w");o.write("op,gemm_n,adds,time_us\n")
b=torch.randn(1024,device="cuda")
def adds(k):
    for _ in range(k): b.add_(1e-3)
def ps(f):
    f();torch.cuda.synchronize();t=[]
    for _ in range(60):
        torch.cuda.synchronize();s=time.perf_counter();f();torch.cuda.synchronize();t.append(time.perf_counter()-s)
    return st.median(t)*1e6
def w(*r):
    l=",".join(map(str,r));o.write(l+"\n");o.flush();print(l,flush=True)
w("sync","",0,"%.2f"%ps(lambda:None))
for k in (1,10,30,100,300):
    w("adds","",k,"%.2f"%ps(lambda k=k:adds(k)))
    g=torch.cuda.CUDAGraph();s=torch.cuda.Stream();s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): adds(k)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g): adds(k)
    w("adds_graph","",k,"%.2f"%ps(g.replay))
for n in (2048,4096,8192):
    A=torch.randn(n,n,device="cuda",dtype=torch.bfloat16);B=torch.randn_like(A);C=torch.empty_like(A)
    for k in (0,10,30,100,300):
        def f(k=k):
            torch.mm(A,B,out=C);adds(k)
        def l(k=k):
            adds(k);torch.mm(A,B,out=C)
        w("gemm_then_adds",n,k,"%.2f"%ps(f))
        if k: w("adds_then_gemm",n,k,"%.2f"%ps(l))
EOF
lscpu | grep -i "model name\|^CPU(s)\|MHz"; for r in 1 2; do timeout 100 python3 /tmp/q.py $OUT/host_queue_$r.csv >/dev/null; done
