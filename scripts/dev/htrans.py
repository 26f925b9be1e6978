# Screening helper (docs/bench/presets.md, 2026-11-27): transform a Hessian file in numpy.
# python htrans.py SRC.safetensors DST.safetensors MODE [BLOCKS]; MODE eig:K:S | corr:S:P | wcorr_bdiag | bcorr_wdiag | sg:A:S
# (the last three read the held-out / self-generated five-block files from the paths below).
import sys, json, struct, numpy as np
from safetensors.numpy import load_file, save_file
src, dst, mode = sys.argv[1], sys.argv[2], sys.argv[3]
f=open(src,'rb'); n=struct.unpack('<Q',f.read(8))[0]; meta=json.loads(f.read(n))['__metadata__']
H=load_file(src)
out={}
layers=set(sys.argv[4].split(',')) if len(sys.argv)>4 else None
for k,h in H.items():
    blk=k.split('.')[1]
    if layers and blk not in layers:
        out[k]=h; continue
    if mode.startswith('eig'):
        # eig:K:S : keep the top K eigencomponents, shrink the rest's off-diagonal by S
        _,K,S=mode.split(':'); K=int(K); S=float(S)
        w,V=np.linalg.eigh(h)
        top=(V[:,-K:]*w[-K:])@V[:,-K:].T if K>0 else np.zeros_like(h)
        R=h-top
        R2=(1-S)*R+S*np.diag(np.diag(R))
        h=top+R2
    elif mode.startswith('corr'):
        # corr:S:P: shrink off-diagonals of the correlation matrix by S, sign-preserving power P
        _,S,P=mode.split(':'); S=float(S); P=float(P)
        d=np.sqrt(np.diag(h)); C=h/np.outer(d,d)
        C2=np.sign(C)*np.abs(C)**P*(1-S); np.fill_diagonal(C2,1.0)
        h=C2*np.outer(d,d)
    elif mode in ('wcorr_bdiag','bcorr_wdiag'):
        global HW
        if 'HW' not in globals(): HW=load_file('/tmp/iq36/h/Hw5.safetensors')
        hw=HW[k]
        db=np.sqrt(np.diag(h)); dw=np.sqrt(np.diag(hw))
        if mode=='wcorr_bdiag': h=hw/np.outer(dw,dw)*np.outer(db,db)
        else: h=h/np.outer(db,db)*np.outer(dw,dw)
    elif mode.startswith('sg'):
        # sg:A:S : correlation (1-A)*C_b + A*C_sg, off-diagonals then shrunk by S, Botchan's diagonal
        global HS
        if 'HS' not in globals(): HS=load_file('/tmp/iq36/h/Hs5.safetensors')
        _,A,S=mode.split(':'); A=float(A); S=float(S)
        hs=HS[k]
        db=np.sqrt(np.diag(h)); ds=np.sqrt(np.diag(hs))
        C=(1-A)*h/np.outer(db,db)+A*hs/np.outer(ds,ds)
        C*=(1-S); np.fill_diagonal(C,1.0)
        h=C*np.outer(db,db)
    out[k]=np.ascontiguousarray(h)
save_file(out,dst,metadata=meta)
